"""`autotune report`: one HTML page of what was tuned, to be looked at rather than read.

The overview first (totals, and a table of every entry, sortable and filterable, each row
linking to the entry's section); a program's calls as one view where one is given (`program=`:
its calls, where each is served from, the step's kernel time before and after); the entries of
one call on several device kinds side by side; the speedup per shape of each kernel; then per
entry its facts, its trial history, and where the search measured enough trials the parameter
importances and the time over the two most important parameters. The page is self-contained
(inline CSS, SVG and script; nothing from the network); with matplotlib installed (the `report`
extra) each chart is also written as a PNG.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autotune.errors import AutotuneError
from autotune.report.charts import (
    Chart,
    devices_chart,
    heatmap_chart,
    history_chart,
    importance_chart,
    speedup_chart,
)
from autotune.report.entries import (
    EntryView,
    device_comparisons,
    param_importances,
    read_entries,
    slug,
    speedup_by_kernel_and_device,
    totals,
)
from autotune.report.page import Page, render
from autotune.report.png import draw_png, write_pngs
from autotune.report.program import ProgramView, program_view

log = logging.getLogger(__name__)
# the fewest measured trials whose importances and heat map say something about the space
MIN_LANDSCAPE_TRIALS = 8

__all__ = [
    "MIN_LANDSCAPE_TRIALS",
    "Chart",
    "EntryView",
    "Page",
    "ProgramView",
    "build",
    "check_out",
    "draw_png",
    "param_importances",
    "program_view",
    "write",
]


def build(db: Any, kernel: str | None = None, program: Any = None) -> Page:
    """What the report of `db` (a TuningDB) shows: every entry (of one kernel, given one), or
    with `program` the entries serving its calls. `program`: 'module:factory' (as `autotune
    calls` takes it), the list `autotune.calls_in` returns, or `tune_program`'s outcomes."""
    views = read_entries(db, kernel)
    view = None
    title = "pallas-autotune report" + (f": {kernel}" if kernel else "")
    if program is not None:
        name, calls = _calls(program)
        view = program_view(db, calls, name)
        served = {r.entry["id"] for r in view.rows if r.source == "db" and r.entry}
        views = [v for v in views if v.entry["id"] in served]
        title = f"pallas-autotune report: {name}"
    speedups = []
    for kernel_name in sorted({v.entry["kernel"] for v in views}):
        rows = [
            (f"{v.entry['signature']} {v.entry['device_kind']}", v.entry["speedup"])
            for v in views
            if v.entry["kernel"] == kernel_name and v.entry["speedup"]
        ]
        if rows:
            speedups.append(speedup_chart(f"{slug(kernel_name)}_speedup", rows, kernel_name))
    cells = speedup_by_kernel_and_device(views)
    several = len({d for by_device in cells.values() for d in by_device}) > 1
    return Page(
        title=title,
        views=views,
        charts={v.anchor: entry_charts(v) for v in views},
        speedups=speedups,
        devices=devices_chart("speedup_by_device_kind", cells) if several else None,
        comparisons=device_comparisons(views),
        totals=totals(views),
        program=view,
    )


def entry_charts(v: EntryView) -> list[Chart]:
    """An entry's trial history (none where its trials are not stored: imported, merged), and
    where the search measured at least MIN_LANDSCAPE_TRIALS the parameter importances and the
    time over the two most important parameters."""
    what = f"{v.entry['kernel']} {v.entry['signature']}"
    if not v.trials:
        return []
    charts = [history_chart(f"{v.anchor}_history", v.trials, v.entry, what)]
    measured = [t for t in v.trials if t["status"] == "ok" and (t["time_s"] or 0) > 0]
    if len(measured) < MIN_LANDSCAPE_TRIALS:
        return charts
    importances = param_importances(measured)
    if importances:
        charts.append(importance_chart(f"{v.anchor}_importance", importances, what))
    if len(importances) >= 2:
        a, b = list(importances)[:2]
        charts.append(heatmap_chart(f"{v.anchor}_heatmap", measured, a, b, v.entry["config"], what))
    return charts


def _calls(program: Any) -> tuple[str, Sequence[Any]]:
    if isinstance(program, str):
        from autotune.runtime.calls import calls_in, load_program

        return program, calls_in(*load_program(program))
    return "the program", list(program)


def check_out(out: str | Path) -> None:
    """Refuse an output directory that cannot be one: an existing file, or a path under one."""
    for path in (Path(out), *Path(out).parents):
        if path.exists():
            if not path.is_dir():
                where = "is" if path == Path(out) else f"is under {path}, which is"
                raise AutotuneError(f"--out {out} {where} a file: give a directory")
            return


def write(
    db: Any, out: str | Path, kernel: str | None = None, program: Any = None, pngs: bool = True
) -> tuple[Path, list[Path]]:
    """Write out/index.html (and a PNG per chart where matplotlib is installed, unless `pngs`
    is False) of `build(db, kernel, program)`; returns their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    page = build(db, kernel, program)
    written = write_pngs(page.all_charts, out) if pngs else []
    index = out / "index.html"
    names = None if written is None else {p.name for p in written}
    index.write_text(render(page, names), encoding="utf-8")
    return index, written or []
