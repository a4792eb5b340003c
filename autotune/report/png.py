"""The report's charts as PNG files, drawn with matplotlib from the data each Chart keeps
(the `report` extra; the HTML report itself needs no plotting library)."""

from __future__ import annotations

import logging
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autotune.report.charts import BEST, BEST_COLOUR, CHOSEN, DEFAULT_TRIAL, Chart
from autotune.report.entries import DUPLICATE, FAILED, MEASURED, REJECTED, STATUS_GROUPS

log = logging.getLogger(__name__)
PNG_TITLE_CHARS = 70  # a title line that fits the chart's width at its font size
MARKERS = {  # matplotlib's version of charts.marker
    MEASURED: {"marker": "o", "color": "#4878cf", "linestyle": ""},
    DUPLICATE: {"marker": "o", "markerfacecolor": "none", "color": "#888", "linestyle": ""},
    REJECTED: {"marker": "x", "color": "#d62728", "linestyle": ""},
    FAILED: {"marker": "^", "color": "#ff7f0e", "linestyle": ""},
}


def write_pngs(charts: Sequence[Chart], out: Path) -> list[Path] | None:
    """Each chart as out/<name>.png; None where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.info("matplotlib is not installed: no PNG versions of the charts")
        return None
    paths = []
    for c in charts:
        fig = draw_png(c)
        path = out / f"{c.name}.png"
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths


def draw_png(c: Chart) -> Any:
    """The matplotlib figure of a chart (needs matplotlib)."""
    import matplotlib.pyplot as plt

    width, height = c.size
    fig, ax = plt.subplots(figsize=(width / 100, max(height, 200) / 100), dpi=100)
    d = c.data
    if c.kind == "history":
        _history(ax, d)
    elif c.kind == "importance":
        ax.barh(list(d["importances"]), list(d["importances"].values()), color="#6acc65")
        ax.invert_yaxis()
        ax.set_xlim(0, 1)
        ax.set_xlabel("share of log-time variance explained")
    elif c.kind == "heatmap":
        grid = [[d["cells"].get((x, y), float("nan")) for x in d["xs"]] for y in d["ys"]]
        im = ax.imshow(grid, origin="lower", aspect="auto", cmap="viridis_r")
        ax.set_xticks(range(len(d["xs"])), [str(x) for x in d["xs"]])
        ax.set_yticks(range(len(d["ys"])), [str(y) for y in d["ys"]])
        ax.set(xlabel=d["a"], ylabel=d["b"])
        fig.colorbar(im, ax=ax, label=d["unit"])
    elif c.kind == "devices":
        from matplotlib.colors import LogNorm

        grid = [
            [d["cells"][k].get(dev, float("nan")) for dev in d["devices"]] for k in d["kernels"]
        ]
        # 1x in the middle of the colours: 4x (or 1/4) and beyond at either end
        im = ax.imshow(grid, aspect="auto", cmap="RdYlGn", norm=LogNorm(0.25, 4.0))
        for j, row in enumerate(grid):
            for i, v in enumerate(row):
                ax.text(i, j, "not tuned" if v != v else f"{v:.2f}x", ha="center", va="center")
        ax.set_xticks(range(len(d["devices"])), [textwrap.fill(v, 16) for v in d["devices"]])
        ax.set_yticks(range(len(d["kernels"])), d["kernels"])
        bar = fig.colorbar(im, ax=ax, label="speedup")
        bar.minorticks_off()
        bar.set_ticks([0.25, 0.5, 1, 2, 4], labels=["0.25x", "0.5x", "1x", "2x", "4x"])
    else:
        ax.barh(d["labels"], d["values"], color="#b47cc7")
        ax.axvline(1.0, color="gray", linestyle="--")
        ax.invert_yaxis()
        ax.set_xlabel("speedup (x)")
    # over the figure, not the axes (which long labels push right), and wrapped to its width
    fig.suptitle(textwrap.fill(c.title, PNG_TITLE_CHARS), fontsize=8)
    fig.tight_layout()
    return fig


def _history(ax: Any, d: dict[str, Any]) -> None:
    factor = d["factor"]
    timed = [(i, s * factor) for i, _, s in d["points"] if s is not None]
    band = max((v for _, v in timed), default=1.0) * 1.08  # the not-timed band, above the rest
    for group in STATUS_GROUPS:
        xy = [(i, band if s is None else s * factor) for i, g, s in d["points"] if g == group]
        if xy:
            ax.plot(*zip(*xy), label=group, **MARKERS[group])
    best, steps = float("inf"), []
    for i, group, s in d["points"]:
        if group == MEASURED and s is not None:
            best = min(best, s * factor)
            steps.append((i, best))
    if steps:
        ax.step(*zip(*steps), where="post", color=BEST_COLOUR, label=BEST)
    chosen = next((p for p in d["points"] if p[0] == d["chosen"] and p[2] is not None), None)
    if chosen:
        ring = {"marker": "o", "markersize": 11, "markerfacecolor": "none", "color": "#222"}
        ax.plot([chosen[0]], [chosen[2] * factor], linestyle="", label=CHOSEN, **ring)
    if d["default_s"]:
        ax.axhline(d["default_s"] * factor, color="#999", linestyle="--", label=DEFAULT_TRIAL)
    if d["side_by_side"]:  # the finalists' figures: written, not drawn among the first pass
        ax.set_title(d["side_by_side"], fontsize=7, loc="left", color="#666")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="trial", ylabel=f"time ({d['unit']})")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
