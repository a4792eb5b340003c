"""A program (a training step) as the report shows it: each `@autotuned` call that
`autotune.calls_in` finds in it, or each outcome `autotune.tune_program` returned, with where
it is served from, its default and tuned times, and the step's summed kernel time before and
after tuning; the calls ordered by the time they save."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.errors import AutotuneError

# the sources whose entry holds the call's measured times (the others serve a configuration
# tuned for another shape, the default, an overlay's or the caller's own)
TIMED_SOURCES = ("db", "shipped")


@dataclass(frozen=True)
class CallRow:
    """One call of the program."""

    index: int  # its place in the program, 1 the first
    kernel: str
    signature: str
    static: str
    source: str  # where it is served from: db, shipped, overlay, nearest, default or caller
    config: dict[str, Any]  # what it runs with
    detail: str  # why, in words, where the lookup says (e.g. which shape's entry serves it)
    entry: dict[str, Any] | None  # the entry serving it where that holds its times
    count: int | None = 1  # how many times the program makes it (None: not known)
    mesh_axes: dict[str, int] = field(default_factory=dict)  # mapped over: shapes per device

    @property
    def default_s(self) -> float | None:
        return None if self.entry is None else self.entry.get("default_time_s")

    @property
    def tuned_s(self) -> float | None:
        return None if self.entry is None else self.entry.get("time_s")

    @property
    def timed(self) -> bool:
        return bool(self.default_s and self.tuned_s)

    @property
    def saved_s(self) -> float | None:
        return self.default_s - self.tuned_s if self.timed else None  # type: ignore[operator]

    @property
    def speedup(self) -> float | None:
        return self.default_s / self.tuned_s if self.timed else None  # type: ignore[operator]


@dataclass(frozen=True)
class ProgramView:
    name: str  # "module:factory", or what the caller calls it
    rows: list[CallRow]  # the calls that save most first, then those without both times
    target: str | None = None  # 'module:factory' where the program was named so

    @property
    def timed(self) -> list[CallRow]:
        return [r for r in self.rows if r.timed]

    @property
    def n_calls(self) -> int:
        """The calls the program makes, each distinct call as often as it is made."""
        return sum(_times(r) for r in self.rows)

    @property
    def n_timed(self) -> int:
        """Of those, the calls whose entry holds both the default's and the tuned time."""
        return sum(_times(r) for r in self.timed)

    @property
    def before_s(self) -> float:
        """The summed default time of the calls with both times, each as often as it is made."""
        return sum(r.default_s * _times(r) for r in self.timed)  # type: ignore[misc]

    @property
    def after_s(self) -> float:
        return sum(r.tuned_s * _times(r) for r in self.timed)  # type: ignore[misc]

    @property
    def untuned(self) -> list[CallRow]:
        """The calls a tune of the program would tune: served the default or another shape's
        configuration (those passing their own block sizes are the caller's)."""
        return [r for r in self.rows if r.source in ("default", "nearest")]

    @property
    def next_command(self) -> str:
        """What tunes the untuned calls."""
        if self.target:
            return f"autotune tune --program {self.target}"
        return "autotune.tune_program(fn, args)"


def _times(row: CallRow) -> int:
    return row.count or 1


def program_view(db: Any, calls: Sequence[Any], name: str = "the program") -> ProgramView:
    """The view of `calls`: ProgramCalls (`autotune.calls_in`) or the outcomes of
    `autotune.tune_program`, with the entries of `db` (a TuningDB) that serve them."""
    rows = [_row(db, i, item) for i, item in enumerate(calls, 1)]
    rows.sort(key=lambda r: (not r.timed, -(r.saved_s or 0.0) * _times(r), r.index))
    return ProgramView(name, rows, name if ":" in name else None)


def _row(db: Any, index: int, item: Any) -> CallRow:
    from autotune.registry import resolve

    if hasattr(item, "task"):  # an outcome of tune_program: its call asked again here
        task = item.task
        kernel = resolve(task.kernel)
        try:
            explained = kernel.explain(*task.inputs(), **task.static_dict)
        except AutotuneError as e:  # the kernel refuses these arguments (a failed outcome)
            return CallRow(
                index, kernel.spec.name, task.label, "{}", "refused", {}, str(e), None, None
            )
        source, config = explained["source"], explained["config"]
        count, axes = None, {}  # an outcome says neither how often it is made nor where
    else:  # a ProgramCall: its source and config as calls_in found them
        kernel = resolve(item.kernel)
        explained = kernel.explain(*item.args, **item.kwargs)
        source, config = item.source, item.config
        count, axes = item.count, dict(item.mesh_axes)
    key = explained["key"]
    return CallRow(
        index=index,
        kernel=kernel.spec.name,
        signature=key["signature"],
        static=key["static"],
        source=source,
        config=config,
        detail=explained.get("detail") or "",
        entry=_serving_entry(db, kernel, source, key),
        count=count,
        mesh_axes=axes,
    )


def _serving_entry(db: Any, kernel: Any, source: str, key: dict[str, Any]) -> dict[str, Any] | None:
    from autotune.db.tables import shipped_table
    from autotune.signature import TuningKey

    entry = None
    if source == "db":
        entry = db.best(TuningKey(**key))
    elif source == "shipped" and kernel.spec.tuned is not None:
        try:
            table = shipped_table(kernel.spec.tuned).for_device(key["kernel"], key["device_kind"])
            entry = table.best(TuningKey(**key))
        except AutotuneError:  # served just now, so readable; a table replaced since is not
            return None
    return None if entry is None else entry.as_row()
