"""`autotune report`: an HTML report of what was tuned, per key and per kernel.

Per key: the optimisation history, parameter importances (first-order ANOVA), a heat map of time over the two most
important parameters; per kernel: the speedup over the default configuration per shape. Charts
are SVG written here, so the report needs no plotting library and is one self-contained file;
with matplotlib installed (extra `report`) each chart is also written as a PNG for documentation.
"""

from __future__ import annotations

import html
import logging
import math
import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.errors import AutotuneError
from autotune.trial import config_text

log = logging.getLogger(__name__)
W, H, PAD = 480, 260, 44  # chart size and margin, in px
LABEL_CHAR_PX = 6.5  # the width of a character of an 11 px sans-serif label, near enough


@dataclass
class Chart:
    """One chart: its SVG, and the data to draw it again as a PNG."""

    name: str  # file stem
    title: str
    svg: str
    kind: str  # history | importance | heatmap | speedup
    data: dict[str, Any]


def build(db: Any, kernel: str | None = None) -> list[tuple[dict[str, Any], list[Chart]]]:
    """The charts of every best entry (and one speedup chart per kernel, keyed by None)."""
    from autotune.schema import KEY_COLUMNS

    sections: list[tuple[dict[str, Any], list[Chart]]] = []
    entries = [e.as_row() for e in db.query(kernel=kernel)]
    names: set[str] = set()
    for entry in entries:
        trials = [t.as_row() for t in db.trials(**{k: entry[k] for k in KEY_COLUMNS})]
        ok = [t for t in trials if t["status"] == "ok" and t["time_s"] is not None]
        name, what = _entry_name(entry, names), f"{entry['kernel']} {entry['signature']}"
        # an entry merged or imported without its trials has no history to chart
        charts = [history_chart(f"{name}_history", ok, what)] if ok else []
        importances = param_importances(ok)
        if importances:
            charts.append(importance_chart(f"{name}_importance", importances, what))
        if len(importances) >= 2:
            a, b = list(importances)[:2]
            charts.append(heatmap_chart(f"{name}_heatmap", ok, a, b, what))
        sections.append((entry, charts))
    for name in sorted({e["kernel"] for e in entries}):
        rows = [e for e in entries if e["kernel"] == name and e["speedup"]]
        if rows:
            sections.append(({"kernel": name}, [speedup_chart(f"{_slug(name)}_speedup", rows)]))
    return sections


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


# ------------------------------------------------------------------ SVG charts


def _svg(body: list[str], title: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
        f'viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="11">'
        f'<title>{html.escape(title)}</title><rect width="{W}" height="{H}" fill="white"/>'
        + "".join(body)
        + "</svg>"
    )


def _text(x: float, y: float, s: Any, anchor: str = "middle", extra: str = "") -> str:
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" {extra}>{html.escape(str(s))}</text>'
    )


def _axes(xlabel: str, ylabel: str) -> list[str]:
    return [
        f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - PAD / 2}" y2="{H - PAD}" stroke="black"/>',
        f'<line x1="{PAD}" y1="{PAD / 2}" x2="{PAD}" y2="{H - PAD}" stroke="black"/>',
        _text((W + PAD) / 2, H - 8, xlabel),
        _text(12, H / 2, ylabel, extra=f'transform="rotate(-90 12 {H / 2})"'),
    ]


def _titled(what: str, title: str) -> str:
    return f"{what}: {title}" if what else title


def history_chart(name: str, trials: Sequence[dict[str, Any]], what: str = "") -> Chart:
    times = [t["time_s"] * 1e3 for t in trials]
    best = [min(times[: i + 1]) for i in range(len(times))]
    title = _titled(what, "optimisation history: time per trial (dots) and best so far (line), ms")
    body = _axes("trial", "ms")
    if times:
        lo, hi = min(times), max(times)
        span = (hi - lo) or 1.0

        def xy(i: int, v: float) -> tuple[float, float]:
            x = PAD + (W - 1.5 * PAD) * (i + 0.5) / len(times)
            return x, H - PAD - (H - 1.5 * PAD) * (v - lo) / span * 0.9 - 4

        body += [
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="#4878cf"/>'
            for x, y in (xy(i, v) for i, v in enumerate(times))
        ]
        points = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(i, v) for i, v in enumerate(best)))
        body.append(f'<polyline points="{points}" fill="none" stroke="#d65f5f" stroke-width="2"/>')
        body += [_text(PAD - 4, xy(0, v)[1] + 4, f"{v:.4g}", "end") for v in (lo, hi)]
    return Chart(name, title, _svg(body, title), "history", {"times": times, "best": best})


def importance_chart(name: str, importances: dict[str, float], what: str = "") -> Chart:
    title = _titled(what, "parameter importances (share of log-time variance explained)")
    body = []
    row = (H - PAD) / max(len(importances), 1)
    for i, (param, value) in enumerate(importances.items()):
        y = PAD / 2 + i * row
        width = (W - 2.5 * PAD - 60) * value
        body.append(
            f'<rect x="{PAD + 60}" y="{y:.1f}" width="{width:.1f}" height="{row * 0.7:.1f}" fill="#6acc65"/>'
        )
        body.append(_text(PAD + 56, y + row * 0.45, param, "end"))
        body.append(_text(PAD + 64 + width, y + row * 0.45, f"{value:.2f}", "start"))
    return Chart(name, title, _svg(body, title), "importance", {"importances": importances})


def heatmap_chart(
    name: str, trials: Sequence[dict[str, Any]], a: str, b: str, what: str = ""
) -> Chart:
    xs = sorted({t["config"][a] for t in trials}, key=_order)
    ys = sorted({t["config"][b] for t in trials}, key=_order)
    cells: dict[tuple, float] = {}
    for t in trials:
        k = (t["config"][a], t["config"][b])
        cells[k] = min(cells.get(k, float("inf")), t["time_s"] * 1e3)
    title = _titled(what, f"best time (ms) over {a} x {b}; blank: not measured")
    lo, hi = min(cells.values()), max(cells.values())
    cw, ch = (W - 1.5 * PAD) / len(xs), (H - 1.5 * PAD) / len(ys)
    body = _axes(a, b)
    for i, x in enumerate(xs):
        body.append(_text(PAD + (i + 0.5) * cw, H - PAD + 14, x))
        for j, y in enumerate(ys):
            v = cells.get((x, y))
            if v is None:
                continue
            shade = int(230 - 180 * ((v - lo) / ((hi - lo) or 1.0)))  # darker is slower
            top = H - PAD - (j + 1) * ch
            body.append(
                f'<rect x="{PAD + i * cw:.1f}" y="{top:.1f}" width="{cw:.1f}" height="{ch:.1f}" '
                f'fill="rgb({shade},{shade},255)" stroke="white"/>'
            )
            body.append(_text(PAD + (i + 0.5) * cw, top + ch / 2 + 4, f"{v:.3g}"))
    body += [_text(PAD - 4, H - PAD - (j + 0.5) * ch + 4, y, "end") for j, y in enumerate(ys)]
    data = {"a": a, "b": b, "xs": xs, "ys": ys, "cells": cells}
    return Chart(name, title, _svg(body, title), "heatmap", data)


def speedup_chart(name: str, entries: Sequence[dict[str, Any]]) -> Chart:
    kernel = entries[0]["kernel"]
    title = f"{kernel}: speedup over the default configuration per shape"
    labels = [f"{e['signature']} {e['device_kind']}" for e in entries]
    values = [e["speedup"] for e in entries]
    body = []
    row = (H - PAD) / len(values)
    top = max(max(values), 1.0)
    # the bars start where the longest label ends (up to half the width; longer ones are cut
    # short with an ellipsis), so that no label runs off the left edge
    left = min(max(len(s) for s in labels) * LABEL_CHAR_PX + 12, W / 2)
    fit = int((left - 12) / LABEL_CHAR_PX)
    for i, (label, value) in enumerate(zip(labels, values)):
        y = PAD / 2 + i * row
        width = (W - left - 10 - PAD) * value / top
        body.append(
            f'<rect x="{left:.1f}" y="{y:.1f}" width="{width:.1f}" height="{row * 0.7:.1f}" fill="#b47cc7"/>'
        )
        shown = label if len(label) <= fit else label[: fit - 1] + "\u2026"
        body.append(_text(left - 4, y + row * 0.45, shown, "end"))
        body.append(_text(left + 4 + width, y + row * 0.45, f"{value:.2f}x", "start"))
    one = left + (W - left - 10 - PAD) / top
    body.append(
        f'<line x1="{one:.1f}" y1="{PAD / 4}" x2="{one:.1f}" y2="{H - PAD / 2}" stroke="gray" stroke-dasharray="4"/>'
    )
    return Chart(name, title, _svg(body, title), "speedup", {"labels": labels, "values": values})


def _order(v: Any) -> tuple:
    return (0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v))


def _entry_name(entry: dict[str, Any], taken: set[str]) -> str:
    """A file name for an entry's charts, by kernel, signature and device kind (and static
    arguments where there are some), unique in the report."""
    parts = [entry["kernel"], entry["signature"], entry["device_kind"]]
    if entry.get("static") not in (None, "", "{}"):
        parts.append(entry["static"])
    base = _slug("_".join(str(p) for p in parts))[:150]
    name, n = base, 2
    while name in taken:
        name, n = f"{base}_{n}", n + 1
    taken.add(name)
    return name


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.-]+", "_", text)


# ------------------------------------------------------------------ output


def check_out(out: str | Path) -> None:
    """Refuse an output directory that cannot be one: an existing file, or a path under one."""
    for path in (Path(out), *Path(out).parents):
        if path.exists():
            if not path.is_dir():
                where = "is" if path == Path(out) else f"is under {path}, which is"
                raise AutotuneError(f"--out {out} {where} a file: give a directory")
            return


def write(db: Any, out: str | Path, kernel: str | None = None) -> tuple[Path, list[Path]]:
    """Write index.html (and PNGs where matplotlib is installed); returns their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    sections = build(db, kernel)
    pngs = _write_pngs(sections, out)
    written = {p.name for p in pngs or []}
    parts = [
        "<!doctype html><meta charset='utf-8'><title>pallas-autotune report</title>",
        "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}"
        "figure{display:inline-block;margin:8px}figcaption{font-size:12px}</style>",
        f"<h1>pallas-autotune report{': ' + html.escape(kernel) if kernel else ''}</h1>",
    ]
    if not sections:
        parts.append("<p>No tuned entries match.</p>")
    if pngs is None:
        parts.append(
            "<p>(PNG versions of the charts need matplotlib: pip install 'pallas-autotune[report]'.)</p>"
        )
    for entry, charts in sections:
        if "signature" in entry:
            config = entry["config"]
            config = config_text(config) if isinstance(config, dict) else "(unreadable config)"
            speedup = f"{entry['speedup']:.2f}x" if entry["speedup"] else "n/a"
            time = f"{entry['time_s'] * 1e3:.4f} ms" if entry["time_s"] else "n/a"
            parts.append(
                f"<h2>{html.escape(entry['kernel'])} {html.escape(entry['signature'])} on "
                f"{html.escape(entry['device_kind'])} ({html.escape(entry['backend'])})</h2>"
                f"<p>best {html.escape(config)}: {time}, speedup {speedup}, "
                f"{entry['n_trials']} trials, {entry['n_rejected']} rejected</p>"
            )
        else:
            parts.append(f"<h2>{html.escape(entry['kernel'])}: speedup per shape</h2>")
        for c in charts:
            png = f"{c.name}.png"
            link = f' (<a href="{html.escape(png)}">PNG</a>)' if png in written else ""
            parts.append(
                f"<figure>{c.svg}<figcaption>{html.escape(c.title)}{link}</figcaption></figure>"
            )
    index = out / "index.html"
    index.write_text("\n".join(parts) + "\n")
    return index, pngs or []


def _write_pngs(sections: list, out: Path) -> list[Path] | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.info("matplotlib is not installed: no PNG versions of the charts")
        return None
    paths = []
    for _, charts in sections:
        for c in charts:
            fig = draw_png(c)
            path = out / f"{c.name}.png"
            fig.savefig(path)
            plt.close(fig)
            paths.append(path)
    return paths


PNG_TITLE_CHARS = 70  # a title line that fits the chart's width at its font size


def draw_png(c: Chart) -> Any:
    """The matplotlib figure of a chart (needs matplotlib)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(W / 100, H / 100), dpi=100)
    d = c.data
    if c.kind == "history":
        ax.plot(d["times"], "o", label="trial")
        ax.plot(d["best"], "-", label="best so far")
        ax.set(xlabel="trial", ylabel="ms")
        ax.legend()
    elif c.kind == "importance":
        ax.barh(list(d["importances"]), list(d["importances"].values()))
        ax.invert_yaxis()
    elif c.kind == "heatmap":
        grid = [[d["cells"].get((x, y), float("nan")) for x in d["xs"]] for y in d["ys"]]
        im = ax.imshow(grid, origin="lower", aspect="auto")
        ax.set_xticks(range(len(d["xs"])), [str(x) for x in d["xs"]])
        ax.set_yticks(range(len(d["ys"])), [str(y) for y in d["ys"]])
        ax.set(xlabel=d["a"], ylabel=d["b"])
        fig.colorbar(im, ax=ax, label="ms")
    else:
        ax.barh(d["labels"], d["values"])
        ax.axvline(1.0, color="gray", linestyle="--")
        ax.invert_yaxis()
    # over the figure, not the axes (which long labels push right), and wrapped to its width
    fig.suptitle(textwrap.fill(c.title, PNG_TITLE_CHARS), fontsize=8)
    fig.tight_layout()
    return fig
