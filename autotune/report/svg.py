"""Drawing in SVG, the little the report's charts need (no plotting library): scales with
round ticks (linear, or log10 over a wide span), time units, text, lines, axes with ticks and
labels, colour ramps."""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from typing import Any

W, H = 520, 300  # a chart's default size in px: two side by side fit a laptop's screen
WIDE = 1040  # the widest a chart grows for its labels: the page's width
LABEL_CHAR_PX = 6.5  # the width of a character of an 11 px sans-serif label, near enough
GRID, INK, MUTED = "#e3e3e3", "#222", "#666"
VIRIDIS = ("#440154", "#3b528b", "#21918c", "#5ec962", "#fde725")


def nice_ticks(lo: float, hi: float, n: int = 5, integer: bool = False) -> list[float]:
    """Round tick values (steps of 1, 2, 2.5 or 5 times a power of ten) covering [lo, hi]."""
    if hi <= lo:
        lo, hi = lo - (abs(lo) or 1.0) / 2, hi + (abs(hi) or 1.0) / 2
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    steps = (1, 2, 5, 10) if integer else (1, 2, 2.5, 5, 10)
    step = next(m * mag for m in steps if m * mag >= raw * (1 - 1e-9))
    if integer:
        step = max(step, 1)
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    return [round(i * step, 12) for i in range(first, last + 1)]


def log_ticks(lo: float, hi: float) -> list[float]:
    """1, 2, 5 times powers of ten covering [lo, hi] (lo > 0), thinned to powers of ten when
    there would be more than eight."""
    ticks = [
        m * 10.0**e
        for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
        for m in (1, 2, 5)
    ]
    first = max(t for t in ticks if t <= lo * (1 + 1e-9))
    last = min(t for t in ticks if t >= hi * (1 - 1e-9))
    ticks = [t for t in ticks if first <= t <= last]
    if len(ticks) > 8:
        ticks = [t for t in ticks if math.log10(t) == round(math.log10(t))] or ticks
    return ticks


class Scale:
    """Data values to pixels along one axis (linear, or log10 where the data span more than
    `LOG_SPAN` times and are not counts), over the span of its ticks."""

    LOG_SPAN = 10.0

    def __init__(self, lo: float, hi: float, a: float, b: float, integer: bool = False) -> None:
        self.log = not integer and lo > 0 and hi / lo > self.LOG_SPAN
        self.ticks = log_ticks(lo, hi) if self.log else nice_ticks(lo, hi, integer=integer)
        self.a, self.b = a, b
        self.lo, self.hi = (self._t(self.ticks[0]), self._t(self.ticks[-1]))

    def _t(self, v: float) -> float:
        return math.log10(v) if self.log else v

    def __call__(self, v: float) -> float:
        return self.a + (self.b - self.a) * (self._t(v) - self.lo) / ((self.hi - self.lo) or 1.0)


def time_unit(seconds: float) -> tuple[float, str]:
    """The unit to show times of this size in: (factor from seconds, name)."""
    for factor, name in ((1.0, "s"), (1e3, "ms"), (1e6, "µs")):
        if seconds * factor >= 1:
            return factor, name
    return 1e9, "ns"


def number(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1e4 else f"{v:,.0f}"


def svg(body: list[str], title: str, w: float = W, h: float = H) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w:.0f}" height="{h:.0f}" '
        f'viewBox="0 0 {w:.0f} {h:.0f}" font-family="sans-serif" font-size="11" fill="{INK}">'
        f'<title>{html.escape(title)}</title><rect width="{w:.0f}" height="{h:.0f}" fill="white"/>'
        + "".join(body)
        + "</svg>"
    )


def svg_text(x: float, y: float, s: Any, anchor: str = "middle", extra: str = "") -> str:
    extra = f" {extra}" if extra else ""
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"{extra}>{html.escape(str(s))}</text>'
    )


def line(x1: float, y1: float, x2: float, y2: float, stroke: str = INK, extra: str = "") -> str:
    extra = f" {extra}" if extra else ""
    return (
        f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{stroke}"{extra}/>'
    )


def fit(label: str, px: float) -> str:
    """The label, cut short with an ellipsis where it is wider than `px`."""
    n = max(int(px / LABEL_CHAR_PX), 2)
    return label if len(label) <= n else label[: n - 1] + "\u2026"


def label_width(labels: Sequence[str], most: float) -> float:
    """The width the longest label needs (at most `most`)."""
    return min(max((len(s) for s in labels), default=0) * LABEL_CHAR_PX + 10, most)


def x_axis(scale: Scale, y: float, top: float, label: str, fmt: Callable = number) -> list[str]:
    out = [line(scale.a, y, scale.b, y)]
    for t in scale.ticks:
        x = scale(t)
        out += [line(x, top, x, y, GRID), line(x, y, x, y + 4), svg_text(x, y + 15, fmt(t))]
    out.append(svg_text((scale.a + scale.b) / 2, y + 31, label, extra=f'fill="{MUTED}"'))
    return out


def y_axis(scale: Scale, x: float, right: float, label: str) -> list[str]:
    out = [line(x, scale.a, x, scale.b)]
    for t in scale.ticks:
        y = scale(t)
        out += [
            line(x, y, right, y, GRID),
            line(x - 4, y, x, y),
            svg_text(x - 6, y + 4, number(t), "end"),
        ]
    middle = (scale.a + scale.b) / 2
    out.append(
        svg_text(13, middle, label, extra=f'fill="{MUTED}" transform="rotate(-90 13 {middle:.1f})"')
    )
    return out


def ramp(t: float, stops: Sequence[str] = VIRIDIS) -> str:
    """The colour at t (0..1) along the stops."""
    t = min(max(t, 0.0), 1.0) * (len(stops) - 1)
    i = min(int(t), len(stops) - 2)
    a, b = (tuple(int(s[k : k + 2], 16) for k in (1, 3, 5)) for s in stops[i : i + 2])
    return "#" + "".join(f"{round(p + (q - p) * (t - i)):02x}" for p, q in zip(a, b))


def ink_on(colour: str) -> str:
    """Black or white text, whichever reads on this background."""
    r, g, b = (int(colour[k : k + 2], 16) for k in (1, 3, 5))
    return INK if 0.299 * r + 0.587 * g + 0.114 * b > 140 else "white"


def two_lines(label: str, px: float) -> list[str]:
    """A column label on up to two lines of `px`, broken at a space where it can be."""
    n = max(int(px / LABEL_CHAR_PX), 2)
    if len(label) <= n:
        return [label]
    cut = label.rfind(" ", 0, n + 1)
    first, rest = (label[:cut], label[cut + 1 :]) if cut > 0 else (label[:n], label[n:])
    return [first, fit(rest, px)]
