"""Recorded landscapes: a space measured exhaustively (a CSV of configurations and times, see
../shared/landscapes/README.md and `autotune db landscape`), read back (load_landscape) and
searched by the same loop real tuning runs (replay), to measure how quickly a strategy finds
the optimum without a device."""

from __future__ import annotations

import csv
import gzip
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.errors import SpaceError
from autotune.search.loop import run_search
from autotune.search.strategies import DEFAULT_STRATEGY
from autotune.search.transfer import OtherDevice, leads
from autotune.space import Param, Space
from autotune.trial import Evaluation, config_id


@dataclass(frozen=True)
class Landscape:
    """A recorded search space: every valid configuration with its time (None: it failed)."""

    space: Space
    configs: list[dict[str, Any]]
    times: list[float | None]
    statuses: list[str]
    name: str = ""  # the file's, less its suffixes

    @property
    def best_ms(self) -> float | None:
        ok = [t for t in self.times if t is not None]
        return min(ok) if ok else None


def load_landscape(path: str | Path) -> Landscape:
    """Read a landscape CSV (gzipped if it ends in .gz): a column per parameter, `time_ms`, `status`."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        text = (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise SpaceError(f"{path}: cannot read the landscape ({e})") from e
    rows = list(csv.reader(io.StringIO(text)))
    if not rows or rows[0][-2:] != ["time_ms", "status"] or len(rows[0]) < 3:
        raise SpaceError(
            f"{path}: not a landscape: the header must be the parameters, then time_ms,status"
        )
    names = rows[0][:-2]
    body = [r for r in rows[1:] if r]
    if not body:
        raise SpaceError(f"{path}: the landscape has no configurations")
    columns = [_parse_column(path, n, [r[i] for r in body]) for i, n in enumerate(names)]
    params = tuple(Param(n, _sorted_values(col)) for n, col in zip(names, columns))
    configs, times, statuses, seen = [], [], [], set()
    for j, r in enumerate(body):
        if len(r) != len(rows[0]):
            raise SpaceError(f"{path} line {j + 2}: {len(r)} fields, expected {len(rows[0])}")
        config = {n: col[j] for n, col in zip(names, columns)}
        if config_id(config) in seen:
            raise SpaceError(f"{path} line {j + 2}: configuration {config} repeats")
        seen.add(config_id(config))
        status = r[-1]
        try:
            t = float(r[-2]) if status == "ok" else None
        except ValueError:
            raise SpaceError(f"{path} line {j + 2}: time_ms {r[-2]!r} is not a number") from None
        configs.append(config)
        times.append(t)
        statuses.append(status)
    return Landscape(Space(params), configs, times, statuses, path.name.split(".")[0])


def _parse_column(path: Path, name: str, cells: list[str]) -> list[Any]:
    for cast in (int, float):
        try:
            return [cast(c) for c in cells]
        except ValueError:
            pass
    if set(cells) <= {"True", "False", "true", "false"}:
        return [c.lower() == "true" for c in cells]
    return cells


def _sorted_values(column: list[Any]) -> tuple:
    values = list(dict.fromkeys(column))
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    return tuple(sorted(values)) if numeric else tuple(values)


def replay(
    path: str | Path | Landscape,
    budget: int,
    seed: int | None,
    strategy: str | None = None,
    others: Sequence[str | Path | Landscape] = (),
    **budgets: Any,
) -> list[dict[str, Any]]:
    """Search a recorded landscape with run_search, looking a time up only when the search
    evaluates that configuration; returns the distinct configurations evaluated, in order,
    as {"config": ..., "time_ms": float | None}. `budgets`: time_limit_s, patience, noise,
    initial (as for run_search).

    `others`: landscapes of the same kernel on other devices, given to the search as the
    tuner gives other device kinds' stored trials (autotune.search.transfer): their best
    configurations measured first (after any `initial`), their times the model's prior."""
    land = path if isinstance(path, Landscape) else load_landscape(path)
    index = {config_id(c): i for i, c in enumerate(land.configs)}
    devices = [
        OtherDevice(o.name or f"other {i}", tuple(zip(o.configs, o.times)))
        for i, o in enumerate(map(_loaded, others))
    ]
    if devices:
        ids = set(index)
        leading = [c for c, _ in leads(devices, lambda c: config_id(c) in ids)]
        budgets["initial"] = [*budgets.get("initial", ()), *leading]

    def evaluate(config: dict[str, Any]) -> Evaluation:
        i = index[config_id(config)]
        return Evaluation.of(config, land.times[i], land.statuses[i])

    # the configurations in the file are the valid space: absent ones were ruled out up front
    found = run_search(
        land.space,
        None,
        evaluate,
        n_trials=budget,
        strategy=strategy or DEFAULT_STRATEGY,
        seed=seed,
        valid=land.configs,
        others=devices,
        **budgets,
    )
    return [{"config": ev.config, "time_ms": ev.value} for ev in found]


def _loaded(land: str | Path | Landscape) -> Landscape:
    return land if isinstance(land, Landscape) else load_landscape(land)
