"""The report's charts, drawn in SVG (autotune.report.svg): axes with ticks and units, the
trial history with every status marked apart, parameter importances, the time over the two
most important parameters, the speedup per shape, and the speedup per kernel and device kind.
Each Chart keeps the data it was drawn from, so that autotune.report.png draws it again."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from autotune.report.entries import (
    DUPLICATE,
    MEASURED,
    REJECTED,
    STATUS_GROUPS,
    status_group,
)
from autotune.report.svg import (
    INK,
    LABEL_CHAR_PX,
    MUTED,
    WIDE,
    H,
    Scale,
    W,
    fit,
    ink_on,
    label_width,
    line,
    number,
    ramp,
    svg,
    svg_text,
    time_unit,
    two_lines,
    x_axis,
    y_axis,
)

BEST_COLOUR = "#c44e52"
BEST, CHOSEN = "fastest so far", "stored"  # the history's line, and its ring round a trial
DEFAULT_TRIAL = "default's trial"  # the history's dashed line: the default's first-pass time


@dataclass
class Chart:
    """One chart: its SVG, and the data to draw it again as a PNG."""

    name: str  # file stem
    title: str
    svg: str
    kind: str  # history | importance | heatmap | speedup | devices
    data: dict[str, Any]
    size: tuple[float, float] = (W, H)  # px


def marker(group: str, x: float, y: float) -> str:
    if group == BEST:
        return line(x - 5, y, x + 5, y, BEST_COLOUR, 'stroke-width="1.5"')
    if group == CHOSEN:
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="6.5" fill="none" stroke="{INK}" stroke-width="1.5"/>'
    if group == MEASURED:
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="#4878cf"/>'
    if group == DUPLICATE:
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="none" stroke="#888"/>'
    if group == REJECTED:
        d = f"M{x - 3:.1f},{y - 3:.1f}l6,6m0,-6l-6,6"
        return f'<path d="{d}" stroke="#d62728" stroke-width="2"/>'
    return f'<path d="M{x:.1f},{y - 4:.1f}l4,7h-8z" fill="#ff7f0e"/>'


# ------------------------------------------------------------------ the charts


def history_chart(
    name: str, trials: Sequence[dict[str, Any]], entry: dict[str, Any], what: str
) -> Chart:
    """Every trial in order: measured ones at their time, duplicates as rings (at the time of
    the program they repeat), rejected and failed ones in a band above; the fastest first
    measurement so far as a line, the default configuration's own trial as a dashed one (a
    first-pass figure, like every point), and the trial whose configuration the entry stores
    circled (the finalists' re-measurement may choose another than the fastest first
    measurement). The entry's stored and default times are the finalists' re-measurement side
    by side, another figure than the first pass's: they are written above the plot, labelled
    so, not drawn among the first-pass points."""
    by_id = {t["id"]: t for t in trials}
    chosen = next((i for i, t in enumerate(trials, 1) if t["id"] == entry.get("trial_id")), None)
    points = []
    for i, t in enumerate(trials, 1):
        group, time_s = status_group(t["status"]), t["time_s"]
        if group == DUPLICATE and time_s is None:
            time_s = by_id.get(t.get("duplicate_of"), {}).get("time_s")
        points.append((i, group, time_s if group in (MEASURED, DUPLICATE) else None))
    default_s = _default_trial_s(trials, by_id)
    timed = [s for _, _, s in points if s is not None]
    factor, unit = time_unit(max(timed, default=1.0))
    title = f"{what}: time per trial in trial order (first pass), {unit}"
    left, right, top, bottom = 66, W - 14, 52, H - 42
    xs = Scale(1, max(len(points), 2), left + 8, right - 8, integer=True)
    body = x_axis(xs, bottom, top, "trial")
    ys = None
    if timed:
        ys = Scale(min(timed) * factor, max(timed) * factor, bottom, top)
        body += y_axis(ys, left, right, f"time ({unit}){', log scale' if ys.log else ''}")
        if default_s:
            y = ys(default_s * factor)
            body += [
                line(left, y, right, y, "#999", 'stroke-dasharray="5 3"'),
                svg_text(right - 2, y - 4, DEFAULT_TRIAL, "end", f'fill="{MUTED}"'),
            ]
        best, steps = math.inf, []
        for i, group, s in points:
            if group == MEASURED and s is not None and s < best:
                if steps:
                    steps.append(f"{xs(i):.1f},{ys(best * factor):.1f}")
                best = s
                steps.append(f"{xs(i):.1f},{ys(s * factor):.1f}")
        if steps:
            steps.append(f"{xs(len(points)):.1f},{ys(best * factor):.1f}")
            body.append(
                f'<polyline points="{" ".join(steps)}" fill="none" stroke="{BEST_COLOUR}" stroke-width="1.5"/>'
            )
    side = side_by_side_text(entry)
    if side:
        body.append(svg_text(16, 32, side, "start", f'fill="{MUTED}"'))
    band = top - 14
    if any(s is None for _, _, s in points) or ys is None:
        body.append(svg_text(left - 6, band + 4, "not timed", "end", f'fill="{MUTED}"'))
    for i, group, s in points:
        y = band if s is None or ys is None else ys(s * factor)
        body.append(marker(group, xs(i), y))
        if i == chosen:
            body.append(marker(CHOSEN, xs(i), y))
    shown = [g for g in STATUS_GROUPS if any(p[1] == g for p in points)]
    extra = [BEST] if ys is not None else []
    body += legend([*shown, *extra, *([CHOSEN] if chosen else [])], 16, 14)
    data = {"points": points, "unit": unit, "factor": factor, "default_s": default_s,
            "chosen": chosen, "side_by_side": side}  # fmt: skip
    return Chart(name, title, svg(body, title), "history", data)


def _default_trial_s(trials: Sequence[dict[str, Any]], by_id: dict[int, Any]) -> float | None:
    """The first-pass time of the default configuration's own trial (a duplicate's: of the
    trial it repeats), None where no trial of it was measured."""
    for t in trials:
        if t.get("is_default"):
            if t["status"] == "duplicate":
                t = by_id.get(t.get("duplicate_of"), {})
            if t.get("status") == "ok" and t.get("time_s"):
                return t["time_s"]
    return None


def side_by_side_text(entry: dict[str, Any]) -> str:
    """The entry's stored and default times, which the finalists measured side by side."""
    tuned, default = entry.get("time_s"), entry.get("default_time_s")
    if not tuned:
        return ""
    factor, unit = time_unit(max(tuned, default or 0.0))
    default_text = f"default {number(default * factor)} {unit}, " if default else ""
    return f"side by side (finalists): {default_text}stored {number(tuned * factor)} {unit}"


def legend(items: Sequence[str], x: float, y: float) -> list[str]:
    """The markers' names in a row from (x, y): measured, duplicate (of a program already
    measured: not measured again), rejected (a wrong result), failed (did not compile, run or
    finish), best so far."""
    out = []
    for item in items:
        out += [marker(item, x + 4, y - 4), svg_text(x + 12, y, item, "start")]
        x += 20 + len(item) * LABEL_CHAR_PX
    return out


def importance_chart(name: str, importances: dict[str, float], what: str) -> Chart:
    title = f"{what}: parameter importances, share of the variance of log time explained"
    h = 84 + 26 * len(importances)
    left = 20 + label_width(list(importances), W / 3)
    xs = Scale(0, 1, left, W - 46)
    body = x_axis(xs, h - 42, 10, "share of log-time variance explained", lambda t: f"{t:.0%}")
    for i, (param, value) in enumerate(importances.items()):
        y = 14 + 26 * i
        body += [
            f'<rect x="{left:.1f}" y="{y}" width="{xs(value) - left:.1f}" height="18" fill="#6acc65"/>',
            svg_text(left - 6, y + 13, fit(param, left - 10), "end"),
            svg_text(xs(value) + 4, y + 13, f"{value:.0%}", "start"),
        ]
    return Chart(
        name, title, svg(body, title, h=h), "importance", {"importances": importances}, (W, h)
    )


def heatmap_chart(
    name: str, trials: Sequence[dict[str, Any]], a: str, b: str, chosen: Any, what: str
) -> Chart:
    """The best measured time of each pair of values of `a` and `b`, fastest brightest; the
    pair of the stored configuration (`chosen`, else the fastest) outlined."""
    xs = sorted({t["config"][a] for t in trials}, key=_order)
    ys = sorted({t["config"][b] for t in trials}, key=_order)
    cells: dict[tuple, float] = {}
    for t in trials:
        k = (t["config"][a], t["config"][b])
        cells[k] = min(cells.get(k, math.inf), t["time_s"])
    factor, unit = time_unit(max(cells.values()))
    cells = {k: v * factor for k, v in cells.items()}
    title = f"{what}: best time over {a} x {b}, {unit} (blank: not measured)"
    lo, hi = min(cells.values()), max(cells.values())
    shade = Scale(lo, hi, 1.0, 0.0) if hi > lo else None  # 1: the fastest
    left = 30 + label_width([str(y) for y in ys], W / 4)
    right, top, bottom = W - 86, 12, H - 42
    cw, ch = (right - left) / len(xs), (bottom - top) / len(ys)
    body = []
    best = min(cells, key=cells.__getitem__)
    if isinstance(chosen, dict) and (chosen.get(a), chosen.get(b)) in cells:
        best = (chosen[a], chosen[b])
    for i, x in enumerate(xs):
        body.append(svg_text(left + (i + 0.5) * cw, bottom + 15, fit(str(x), cw)))
        for j, y in enumerate(ys):
            v = cells.get((x, y))
            if v is None:
                continue
            colour = ramp(shade(v) if shade else 1.0)
            edge = 'stroke="black" stroke-width="2"' if (x, y) == best else 'stroke="white"'
            top_j = bottom - (j + 1) * ch
            body.append(
                f'<rect x="{left + i * cw:.1f}" y="{top_j:.1f}" width="{cw:.1f}" '
                f'height="{ch:.1f}" fill="{colour}" {edge}/>'
            )
            if cw >= 34 and ch >= 14:
                body.append(
                    svg_text(
                        left + (i + 0.5) * cw,
                        top_j + ch / 2 + 4,
                        number(v),
                        extra=f'fill="{ink_on(colour)}"',
                    )
                )
    body += [
        svg_text(left - 6, bottom - (j + 0.5) * ch + 4, fit(str(y), left - 30), "end")
        for j, y in enumerate(ys)
    ]
    body.append(svg_text((left + right) / 2, bottom + 31, a, extra=f'fill="{MUTED}"'))
    middle = (top + bottom) / 2
    body.append(
        svg_text(13, middle, b, extra=f'fill="{MUTED}" transform="rotate(-90 13 {middle:.1f})"')
    )
    body += colour_bar(
        Scale(lo, hi, bottom, top) if hi > lo else None, right + 18, top, bottom, unit
    )
    data = {"a": a, "b": b, "xs": xs, "ys": ys, "cells": cells, "unit": unit}
    return Chart(name, title, svg(body, title), "heatmap", data)


def colour_bar(scale: Scale | None, x: float, top: float, bottom: float, unit: str) -> list[str]:
    """The heat map's legend: fastest (brightest) at the bottom, with the scale's ticks."""
    n = 24
    out = [
        f'<rect x="{x}" y="{bottom - (k + 1) * (bottom - top) / n:.1f}" width="12" '
        f'height="{(bottom - top) / n + 0.5:.1f}" fill="{ramp(1 - k / (n - 1))}"/>'
        for k in range(n)
    ]
    if scale is not None:
        for t in scale.ticks:
            y = scale(t)
            out += [line(x + 12, y, x + 16, y), svg_text(x + 18, y + 4, number(t), "start")]
    out.append(svg_text(x + 6, top - 2 if top > 12 else bottom + 15, unit))
    return out


def speedup_chart(name: str, rows: Sequence[tuple[str, float]], kernel: str) -> Chart:
    """Per shape (and device kind) of one kernel: the speedup over its default configuration."""
    title = f"{kernel}: speedup over the default configuration per shape"
    labels, values = [r[0] for r in rows], [r[1] for r in rows]
    h = 76 + 22 * len(rows)
    left = label_width(labels, WIDE - 330) + 6  # long labels widen the chart, up to WIDE
    w = max(W, left + 330)
    xs = Scale(0, max(max(values), 1.0), left, w - 50)
    body = x_axis(
        xs, h - 42, 8, "speedup over the default configuration (x)", lambda t: f"{number(t)}x"
    )
    for i, (label, value) in enumerate(rows):
        y = 12 + 22 * i
        body += [
            f'<rect x="{left:.1f}" y="{y}" width="{xs(value) - left:.1f}" height="15" fill="#b47cc7"/>',
            svg_text(left - 6, y + 12, fit(label, left - 10), "end"),
            svg_text(xs(value) + 4, y + 12, f"{value:.2f}x", "start"),
        ]
    body.append(line(xs(1.0), 4, xs(1.0), h - 42, "#555", 'stroke-dasharray="4"'))
    data = {"labels": labels, "values": values}
    return Chart(name, title, svg(body, title, w, h), "speedup", data, (w, h))


def devices_chart(name: str, cells: dict[str, dict[str, float]]) -> Chart:
    """Kernels (rows) x device kinds (columns): the geometric mean speedup of a kernel's
    entries there, green above 1x, red below."""
    title = "speedup over the default configuration per kernel and device kind (geometric mean over shapes)"
    kernels = list(cells)
    devices = sorted({d for by_device in cells.values() for d in by_device})
    left = 16 + label_width(kernels, W / 3)
    w = min(max(W, left + 14 + 110 * len(devices)), WIDE)  # a column fits a device's name
    cw, ch, top = (w - 14 - left) / len(devices), 26, 44
    h = top + ch * len(kernels) + 14
    body = []
    for i, d in enumerate(devices):
        words = two_lines(d, cw)
        body += [svg_text(left + (i + 0.5) * cw, top - 26 + 13 * k, w) for k, w in enumerate(words)]
    for j, kernel in enumerate(kernels):
        y = top + j * ch
        body.append(svg_text(left - 6, y + ch / 2 + 4, fit(kernel, left - 16), "end"))
        for i, d in enumerate(devices):
            v = cells[kernel].get(d)
            colour = "#f3f3f3" if v is None else _speedup_colour(v)
            body.append(
                f'<rect x="{left + i * cw:.1f}" y="{y}" width="{cw:.1f}" height="{ch}" fill="{colour}" stroke="white"/>'
            )
            body.append(
                svg_text(
                    left + (i + 0.5) * cw,
                    y + ch / 2 + 4,
                    "not tuned" if v is None else f"{v:.2f}x",
                    extra=f'fill="{MUTED if v is None else ink_on(colour)}"',
                )
            )
    data = {"kernels": kernels, "devices": devices, "cells": cells}
    return Chart(name, title, svg(body, title, w, h), "devices", data, (w, h))


def _speedup_colour(v: float) -> str:
    t = max(min(math.log(v) / math.log(4), 1.0), -1.0)  # 4x (or 1/4) and beyond: full colour
    return ramp(t, ("#ffffff", "#1a9850")) if t >= 0 else ramp(-t, ("#ffffff", "#d73027"))


def _order(v: Any) -> tuple:
    return (0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v))
