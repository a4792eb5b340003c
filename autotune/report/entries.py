"""What the report shows of a database: each best entry with its trials, counted by status;
the totals; the entries of one call on several device kinds, side by side."""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.errors import AutotuneError
from autotune.trial import StoredTrial

log = logging.getLogger(__name__)

# A trial's status as the report groups it: measured, a duplicate of a measured program,
# rejected by the oracle, or failed (did not compile, run or finish, or was pruned).
MEASURED, DUPLICATE, REJECTED, FAILED = "measured", "duplicate", "rejected", "failed"
STATUS_GROUPS = (MEASURED, DUPLICATE, REJECTED, FAILED)
GROUP_OF_STATUS = {"ok": MEASURED, "duplicate": DUPLICATE, "rejected": REJECTED}


def status_group(status: str) -> str:
    return GROUP_OF_STATUS.get(status, FAILED)


@dataclass
class EntryView:
    """One best entry (a row of TuningDB.query), its trials (oldest first) and its anchor."""

    entry: dict[str, Any]
    trials: list[dict[str, Any]]
    anchor: str  # unique in the report: the section's id and its PNG files' stem
    current_version: str | None  # the registered kernel's version; None: not registered here

    @property
    def stale(self) -> bool | None:
        """Tuned for another version of its kernel (None: the kernel is not registered here)."""
        if self.current_version is None:
            return None
        return self.entry["kernel_version"] != self.current_version

    @property
    def counts(self) -> dict[str, int | None]:
        """Trials by status group: of the stored trials, or where none are stored (an imported
        entry) the entry's own counts, failures unknown (None)."""
        if not self.trials:
            e = self.entry
            rejected = e["n_rejected"] or 0
            return {
                MEASURED: None if e["n_trials"] is None else e["n_trials"] - rejected,
                DUPLICATE: None,
                REJECTED: rejected,
                FAILED: None,
            }
        counts: dict[str, int | None] = dict.fromkeys(STATUS_GROUPS, 0)
        for t in self.trials:
            counts[status_group(t["status"])] += 1  # type: ignore[operator]
        return counts

    @property
    def n_trials(self) -> int | None:
        return len(self.trials) if self.trials else self.entry["n_trials"]

    @property
    def devices(self) -> list[str]:
        """The devices that measured its trials ("gpu:0", ...), where the trials name them."""
        return sorted({t["device"] for t in self.trials if t.get("device")})

    @property
    def best_trial(self) -> dict[str, Any] | None:
        return next((t for t in self.trials if t["id"] == self.entry.get("trial_id")), None)

    @property
    def peak_memory_bytes(self) -> int | None:
        """The compiler's peak memory of the best trial's program, where it was recorded."""
        best = self.best_trial
        return None if best is None else best.get("memory_peak_bytes")


def read_entries(db: Any, kernel: str | None = None) -> list[EntryView]:
    """Every best entry of `db` (of one kernel, given one) with its trials."""
    from autotune.db.schema import KEY_COLUMNS

    entries = [e.as_row() for e in db.query(kernel=kernel)]
    by_key: dict[tuple, list[dict[str, Any]]] = {}
    for t in map(StoredTrial.as_row, db.trials(kernel=kernel)):
        by_key.setdefault(tuple(t[k] for k in KEY_COLUMNS), []).append(t)
    versions = current_versions()
    taken: set[str] = set()
    return [
        EntryView(
            entry=e,
            trials=by_key.get(tuple(e[k] for k in KEY_COLUMNS), []),
            anchor=_anchor(e, taken),
            current_version=versions.get(e["kernel"]),
        )
        for e in entries
    ]


def current_versions() -> dict[str, str]:
    """Each registered kernel's version, by name ({} where the shipped kernels cannot be
    imported here: nothing is then called stale)."""
    from autotune.registry import registered

    try:
        return {name: k.spec.version for name, k in registered().items()}
    except AutotuneError as e:
        log.warning("the report cannot tell stale entries: %s", e)
        return {}


def _anchor(entry: dict[str, Any], taken: set[str]) -> str:
    """A name for an entry's section and chart files, by kernel, signature and device kind
    (and static arguments where there are some), unique in the report."""
    parts = [entry["kernel"], entry["signature"], entry["device_kind"]]
    if entry.get("static") not in (None, "", "{}"):
        parts.append(entry["static"])
    base = slug("_".join(str(p) for p in parts))[:150]
    name, n = base, 2
    while name in taken:
        name, n = f"{base}_{n}", n + 1
    taken.add(name)
    return name


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.-]+", "_", text)


def param_importances(trials: Sequence[dict[str, Any]]) -> dict[str, float]:
    """How much of the variance of log(time) each parameter explains on its own (first-order
    ANOVA: between-group over total variance), normalised to sum to 1, most important first;
    {} where fewer than three trials or nothing varies. Log time, so a parameter that halves
    the time counts the same at any scale."""
    if len(trials) < 3:
        return {}
    logs = [math.log(t["time_s"]) for t in trials]
    mean = sum(logs) / len(logs)
    total = sum((v - mean) ** 2 for v in logs)
    if total == 0:
        return {}
    explained = {}
    for param in trials[0]["config"]:
        groups: dict[str, list[float]] = {}
        for t, v in zip(trials, logs):
            groups.setdefault(repr(t["config"].get(param)), []).append(v)
        if len(groups) > 1:
            between = sum(len(g) * (sum(g) / len(g) - mean) ** 2 for g in groups.values())
            explained[param] = between / total
    norm = sum(explained.values()) or 1.0
    return dict(sorted(((k, v / norm) for k, v in explained.items()), key=lambda kv: -kv[1]))


def geomean(values: Iterable[float]) -> float | None:
    logs = [math.log(v) for v in values if v]
    return math.exp(sum(logs) / len(logs)) if logs else None


@dataclass(frozen=True)
class Totals:
    entries: int
    kernels: int
    device_kinds: int
    trials: int
    by_group: dict[str, int]  # trials by status group, of the entries whose trials are stored
    stale: int
    speedup_geomean: float | None
    speedup_best: float | None


def totals(views: Sequence[EntryView]) -> Totals:
    by_group = dict.fromkeys(STATUS_GROUPS, 0)
    for v in views:
        for group, n in v.counts.items():
            by_group[group] += n or 0
    speedups = [v.entry["speedup"] for v in views if v.entry["speedup"]]
    return Totals(
        entries=len(views),
        kernels=len({v.entry["kernel"] for v in views}),
        device_kinds=len({v.entry["device_kind"] for v in views}),
        trials=sum(v.n_trials or 0 for v in views),
        by_group=by_group,
        stale=sum(bool(v.stale) for v in views),
        speedup_geomean=geomean(speedups),
        speedup_best=max(speedups, default=None),
    )


@dataclass(frozen=True)
class DeviceComparison:
    """One call (kernel, signature, static arguments) tuned on several device kinds."""

    kernel: str
    signature: str
    static: str
    by_device: dict[str, EntryView]  # device kind -> its entry
    differing: tuple[str, ...]  # the parameters whose tuned values differ between them


def device_comparisons(views: Sequence[EntryView]) -> list[DeviceComparison]:
    """The calls tuned on more than one device kind. Of several entries of one call on one
    device kind (other kernel versions or backends) the current, then the newest, is shown."""
    groups: dict[tuple[str, str, str], dict[str, EntryView]] = {}
    for v in sorted(views, key=_preference):
        e = v.entry
        groups.setdefault((e["kernel"], e["signature"], e["static"]), {})[e["device_kind"]] = v
    found = []
    for (kernel, signature, static), by_device in groups.items():
        if len(by_device) < 2:
            continue
        configs = [v.entry["config"] for v in by_device.values()]
        params = sorted({p for c in configs if isinstance(c, dict) for p in c})
        differing = tuple(
            p
            for p in params
            if len({repr(c.get(p)) if isinstance(c, dict) else None for c in configs}) > 1
        )
        found.append(
            DeviceComparison(kernel, signature, static, dict(sorted(by_device.items())), differing)
        )
    return found


def _preference(v: EntryView) -> tuple:
    """Sorts the entry to show last: the current version, then the newest."""
    return (v.stale is False, v.entry.get("tuned_at") or "")


def speedup_by_kernel_and_device(views: Sequence[EntryView]) -> dict[str, dict[str, float]]:
    """kernel -> device kind -> the geometric mean speedup of its entries there."""
    cells: dict[str, dict[str, list[float]]] = {}
    for v in views:
        if v.entry["speedup"]:
            e = v.entry
            cells.setdefault(e["kernel"], {}).setdefault(e["device_kind"], []).append(e["speedup"])
    return {
        k: {d: geomean(s) for d, s in sorted(by_device.items())}  # type: ignore[misc]
        for k, by_device in sorted(cells.items())
    }
