"""The report's page: one self-contained HTML file (inline CSS, SVG and a few lines of script
to sort and filter its tables; nothing is loaded from the network). In reading order: the
program's calls where one was given, the totals and the overview table of every entry, the
entries tuned on several device kinds side by side, the speedup per shape of each kernel, then
one section per entry with its charts."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from autotune.report.assets import CSS, SCRIPT
from autotune.report.charts import Chart
from autotune.report.entries import (
    DUPLICATE,
    FAILED,
    REJECTED,
    DeviceComparison,
    EntryView,
    Totals,
)
from autotune.report.program import ProgramView
from autotune.report.svg import time_unit
from autotune.trial import config_text


@dataclass
class Page:
    """What one report holds (autotune.report.build)."""

    title: str
    views: list[EntryView]
    charts: dict[str, list[Chart]]  # an entry's anchor -> its charts
    speedups: list[Chart]  # one per kernel
    devices: Chart | None  # speedup per kernel and device kind, where there are several kinds
    comparisons: list[DeviceComparison]
    totals: Totals
    program: ProgramView | None = None

    @property
    def all_charts(self) -> list[Chart]:
        devices = [self.devices] if self.devices else []
        return [*devices, *self.speedups, *(c for v in self.views for c in self.charts[v.anchor])]


def render(page: Page, pngs: set[str] | None) -> str:
    """The page's HTML; `pngs`: the chart files written beside it (None: matplotlib missing)."""
    e = html.escape
    links = [("overview", "Overview")]
    if page.program is not None:
        links.insert(0, ("program", "Program"))
    if page.comparisons:
        links.append(("devices", "Devices side by side"))
    if page.speedups:
        links.append(("speedups", "Speedup per shape"))
    if page.views:
        links.append(("entries", "Entries"))
    parts = [
        f"<!doctype html><html lang='en'><meta charset='utf-8'>"
        f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{e(page.title)}</title><style>{CSS}</style>",
        "<nav>" + "".join(f'<a href="#{a}">{label}</a>' for a, label in links) + "</nav>",
        f"<h1>{e(page.title)}</h1>",
    ]
    if pngs is None:
        parts.append(
            "<p class=small>PNG versions of the charts need matplotlib: <code>pip install -e "
            "'.[report]'</code> in a checkout of pallas-autotune (it is not on a package index).</p>"
        )
    if page.program is not None:
        parts.append(program_html(page.program, {v.entry["id"]: v.anchor for v in page.views}))
    parts.append(overview_html(page.views, page.totals))
    if page.comparisons:
        parts.append("<section id=devices><h2>Devices side by side</h2>")
        if page.devices:
            parts.append(figure(page.devices, pngs))
        parts.append(comparisons_html(page.comparisons))
        parts.append("</section>")
    if page.speedups:
        parts.append("<section id=speedups><h2>Speedup per shape</h2><div class=charts>")
        parts += [figure(c, pngs) for c in page.speedups]
        parts.append("</div></section>")
    if page.views:
        parts.append("<section id=entries><h2>Entries</h2>")
        parts += [entry_html(v, page.charts[v.anchor], pngs) for v in page.views]
        parts.append("</section>")
    parts.append(f"<script>{SCRIPT}</script></html>")
    return "\n".join(parts) + "\n"


# ------------------------------------------------------------------ formatting


def seconds(s: float | None) -> str:
    if s is None:
        return "n/a"
    if s == 0:
        return "0"
    factor, unit = time_unit(abs(s))
    return f"{s * factor:.3g} {unit}"


def times(x: float | None) -> str:
    return f"{x:.2f}x" if x else "n/a"


def when(iso: str | None) -> str:
    if not iso:
        return "n/a"
    try:
        return datetime.fromisoformat(iso).strftime("%Y-%m-%d %H:%M")
    except ValueError:
        return iso


def mib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:.3g} MiB"


def sig(signature: str) -> str:
    """A signature that may break after each argument's comma, never inside a shape."""
    return html.escape(signature).replace("],", "],<wbr>")


def static_line(static: str) -> str:
    """Static arguments (JSON) under a signature, breaking after commas; "" where none."""
    if static in ("", "{}"):
        return ""
    return f"<div class=small>{html.escape(static).replace(',', ',<wbr>')}</div>"


def num_cell(text: str, value: Any, extra: str = "") -> str:
    """A right-aligned cell that sorts by `value` (empty: sorts last)."""
    v = "" if value is None else f"{value:.6g}" if isinstance(value, float) else str(value)
    return f'<td class=num data-v="{v}"{extra}>{html.escape(text)}</td>'


def speedup_cell(x: float | None) -> str:
    width = 0 if not x else min(max(x - 1, 0) / 3, 1) * 100  # the bar is full at 4x
    return (
        f'<td class=num data-v="{x or ""}"><span class=spd style="--w:{width:.0f}%">'
        f"{times(x)}</span></td>"
    )


def badge(text: str, kind: str, title: str = "") -> str:
    title = f' title="{html.escape(title)}"' if title else ""
    return f"<span class='badge {kind}'{title}>{html.escape(text)}</span>"


def stale_badge(v: EntryView) -> str:
    if v.stale is None:
        return badge("unknown", "unknown", "its kernel is not registered here: --import its module")
    if v.stale:
        return badge(
            "stale",
            "stale",
            f"tuned for kernel version {v.entry['kernel_version']}, "
            f"now {v.current_version}: re-tune it",
        )
    return badge("current", "current")


def figure(c: Chart, pngs: set[str] | None) -> str:
    png = f"{c.name}.png"
    link = f' (<a href="{html.escape(png)}">PNG</a>)' if pngs and png in pngs else ""
    return f"<figure><figcaption>{html.escape(c.title)}{link}</figcaption>{c.svg}</figure>"


# ------------------------------------------------------------------ sections


def overview_html(views: Sequence[EntryView], t: Totals) -> str:
    e = html.escape
    failed = t.by_group[FAILED]
    cards = [
        (t.entries, "entries"),
        (t.kernels, "kernels"),
        (t.device_kinds, "device kinds"),
        (
            t.trials,
            f"trials: {t.by_group[REJECTED]} rejected, {failed} failed, "
            f"{t.by_group[DUPLICATE]} duplicate",
        ),
        (times(t.speedup_geomean), "speedup, geometric mean"),
        (times(t.speedup_best), "best speedup"),
        (t.stale, "stale (re-tune)"),
    ]
    parts = [
        "<section id=overview><h2>Overview</h2>",
        "<div class=cards>"
        + "".join(
            f"<div class=card><b>{e(str(n))}</b><span>{e(label)}</span></div>" for n, label in cards
        )
        + "</div>",
    ]
    if not views:
        parts.append("<p>No tuned entries match.</p></section>")
        return "".join(parts)
    kinds = sorted({v.entry["device_kind"] for v in views})
    memory = any(v.peak_memory_bytes is not None for v in views)
    select = ""
    if len(kinds) > 1:
        options = "".join(f"<option>{e(k)}</option>" for k in kinds)
        select = f"<select id=device aria-label='device kind'><option value=''>every device kind</option>{options}</select>"
    parts.append(
        "<div class=controls><input id=filter type=search placeholder='filter: kernel, shape, "
        f"dtype, device...' aria-label='filter the entries'>{select}<span id=shown class=small>"
        f"{len(views)} entries</span><span class=small>click a column to sort</span></div>"
    )
    heads = [
        "kernel",
        "signature",
        "device kind",
        "backend",
        "best",
        "default",
        "speedup",
        "trials",
        "rejected",
        "failed",
        "tuned",
        "stale",
    ]
    if memory:
        heads.insert(10, "peak memory")
    numeric = {"best", "default", "speedup", "trials", "rejected", "failed", "peak memory"}
    parts.append(
        "<table class=sortable id=overview-table><thead><tr>"
        + "".join(f"<th{' class=num' if h in numeric else ''}>{h}</th>" for h in heads)
        + "</tr></thead><tbody>"
    )
    for v in views:
        r, counts = v.entry, v.counts
        static = static_line(r["static"])
        devices = f"<div class=small>{e(', '.join(v.devices))}</div>" if v.devices else ""
        breakdown = ", ".join(f"{n} {g}" for g, n in counts.items() if n)
        cells = [
            f'<td><a href="#e-{v.anchor}">{e(r["kernel"])}</a></td>',
            f"<td class=sig>{sig(r['signature'])}{static}</td>",
            f"<td>{e(r['device_kind'])}{devices}</td>",
            f"<td>{e(r['backend'])}</td>",
            num_cell(seconds(r["time_s"]), r["time_s"]),
            num_cell(seconds(r["default_time_s"]), r["default_time_s"]),
            speedup_cell(r["speedup"]),
            num_cell(str(v.n_trials), v.n_trials, f' title="{e(breakdown)}"'),
            num_cell(str(counts[REJECTED]), counts[REJECTED]),
            num_cell("n/a" if counts[FAILED] is None else str(counts[FAILED]), counts[FAILED]),
            f'<td class=num data-v="{e(r["tuned_at"] or "")}" title="{e(when(r["tuned_at"]))}">'
            f"{e(when(r['tuned_at'])[:10])}</td>",
            f"<td>{stale_badge(v)}</td>",
        ]
        if memory:
            cells.insert(10, num_cell(mib(v.peak_memory_bytes), v.peak_memory_bytes))
        parts.append(f'<tr data-device="{e(r["device_kind"])}">' + "".join(cells) + "</tr>")
    parts.append("</tbody></table></section>")
    return "\n".join(parts)


def program_html(p: ProgramView, anchors: dict[int, str]) -> str:
    """The program's calls: how many are tuned here first (the total before and after covers
    only those), the command that tunes the others, then a row per distinct call."""
    e = html.escape
    n, n_timed = p.n_calls, p.n_timed
    distinct = len(p.rows)
    made = f"{n} calls ({distinct} distinct)" if n != distinct else f"{n} calls"
    parts = [f"<section id=program><h2>Program {e(p.name)}: {e(made)}</h2>"]
    if not p.rows:
        parts.append("<p>The program makes no @autotuned calls.</p></section>")
        return "".join(parts)
    cards = [(f"{n_timed} of {n}", "calls tuned here, with both times (the totals cover these)")]
    if p.timed:
        cards += [
            (seconds(p.before_s), f"their kernel time at the defaults ({n_timed} calls)"),
            (seconds(p.after_s), f"their kernel time tuned ({n_timed} calls)"),
            (times(p.before_s / p.after_s), f"speedup of those {n_timed} calls"),
        ]
    parts.append(
        "<div class=cards>"
        + "".join(f"<div class=card><b>{e(a)}</b><span>{e(b)}</span></div>" for a, b in cards)
        + "</div>"
    )
    left = n - n_timed
    if left:
        untuned = sum(r.count or 1 for r in p.untuned)
        todo = (
            f" To tune the {untuned} served the default or another shape's configuration: "
            f"<code class=next>{e(p.next_command)}</code>"
            if untuned
            else ""
        )
        parts.append(
            f"<p class=coverage>{left} of the {n} calls have no tuned time to compare here "
            f"and are left out of the totals.{todo}</p>"
        )
    parts.append(
        "<p class=small>Each distinct call is one row; a call the step makes more than once "
        "counts that many times in the totals (<b>calls</b>). Times are the entries' own: "
        "the default's and the tuned configuration's, re-measured side by side when tuned. "
        "The calls that save most come first.</p>"
    )
    longest = max((r.default_s or 0.0 for r in p.timed), default=0.0) or 1.0
    heads = [
        "#",
        "kernel",
        "signature",
        "calls",
        "source",
        "config",
        "default",
        "tuned",
        "speedup",
        "saved",
        "default (grey) and tuned",
    ]
    numeric = {"#", "calls", "default", "tuned", "speedup", "saved"}
    parts.append(
        "<div class=wide><table class=sortable id=program-table><thead><tr>"
        + "".join(f"<th{' class=num' if h in numeric else ''}>{h}</th>" for h in heads)
        + "</tr></thead><tbody>"
    )
    for r in p.rows:
        anchor = anchors.get(r.entry.get("id")) if r.source == "db" and r.entry else None
        name = f'<a href="#e-{anchor}">{e(r.kernel)}</a>' if anchor else e(r.kernel)
        static = static_line(r.static)
        axes = ", ".join(f"{a}={size}" for a, size in r.mesh_axes.items())
        mesh = f"<div class=small>per device, over mesh axes {e(axes)}</div>" if axes else ""
        detail = f"<div class=small>{e(r.detail)}</div>" if r.detail else ""
        saved = seconds(r.saved_s) if r.timed else "n/a" if r.entry else "not tuned"
        count = "n/a" if r.count is None else str(r.count)
        bar = ""
        if r.timed:
            bar = (
                f"<div class=tbar><i style='width:{100 * r.default_s / longest:.1f}%'></i>"  # type: ignore[operator]
                f"<b style='width:{100 * r.tuned_s / longest:.1f}%'></b></div>"
            )  # type: ignore[operator]
        parts.append(
            "<tr>"
            + num_cell(str(r.index), r.index)
            + f"<td>{name}</td><td class=sig>{sig(r.signature)}{static}{mesh}</td>"
            + num_cell(count, r.count)
            + f"<td>{badge(r.source, r.source)}{detail}</td>"
            + f"<td><code>{e(config_text(r.config))}</code></td>"
            + num_cell(seconds(r.default_s), r.default_s)
            + num_cell(seconds(r.tuned_s), r.tuned_s)
            + speedup_cell(r.speedup)
            + num_cell(saved, r.saved_s)
            + f"<td>{bar}</td></tr>"
        )
    parts.append("</tbody></table></div></section>")
    return "\n".join(parts)


def comparisons_html(comparisons: Sequence[DeviceComparison]) -> str:
    e = html.escape
    parts = [
        "<p class=small>Each call tuned on more than one device kind; the parameters whose "
        "tuned values differ between the device kinds are in bold.</p>",
        "<table><thead><tr><th>call</th><th>device kind</th><th class=num>best</th>"
        "<th class=num>default</th><th class=num>speedup</th><th>configuration</th></tr></thead><tbody>",
    ]
    for c in comparisons:
        static = static_line(c.static)
        first = True
        for kind, v in c.by_device.items():
            r = v.entry
            config = r["config"] if isinstance(r["config"], dict) else {}
            shown = " ".join(
                f"<b>{e(k)}={e(str(x))}</b>" if k in c.differing else f"{e(k)}={e(str(x))}"
                for k, x in sorted(config.items())
            )
            call = ""
            if first:
                call = (
                    f"<td rowspan={len(c.by_device)}>{e(c.kernel)}<div class=sig>"
                    f"{sig(c.signature)}</div>{static}</td>"
                )
            first = False
            parts.append(
                f"<tr>{call}<td><a href='#e-{v.anchor}'>{e(kind)}</a></td>"
                + num_cell(seconds(r["time_s"]), r["time_s"])
                + num_cell(seconds(r["default_time_s"]), r["default_time_s"])
                + speedup_cell(r["speedup"])
                + f"<td><code>{shown}</code></td></tr>"
            )
    parts.append("</tbody></table>")
    return "\n".join(parts)


def entry_html(v: EntryView, charts: Sequence[Chart], pngs: set[str] | None) -> str:
    e, r = html.escape, v.entry
    config = config_text(r["config"]) if isinstance(r["config"], dict) else "(unreadable config)"
    counts = ", ".join(f"{n} {g}" for g, n in v.counts.items() if n)
    facts = [
        ("best", f"<code>{e(config)}</code>"),
        (
            "time",
            f"{seconds(r['time_s'])}, default {seconds(r['default_time_s'])}: "
            f"speedup {times(r['speedup'])} (the finalists re-measured side by side)",
        ),
        ("trials", f"{v.n_trials}" + (f" ({e(counts)})" if counts else "")),
    ]
    if r["static"] not in ("", "{}"):
        facts.append(("static", f"<code>{e(r['static'])}</code>"))
    if v.devices:
        facts.append(("measured on", e(", ".join(v.devices))))
    if v.peak_memory_bytes is not None:
        facts.append(("peak memory", f"{mib(v.peak_memory_bytes)} (the compiler's estimate)"))
    facts.append(
        (
            "tuned",
            e(
                ", ".join(
                    part
                    for part in (
                        f"{when(r['tuned_at'])} by {r['strategy']}",
                        f"timer {r['timer']}" if r["timer"] else "",
                        f"jax {r['jax_version']}" if r["jax_version"] else "",
                        f"on {r['host']}" if r["host"] else "",
                    )
                    if part
                )
            ),
        )
    )
    facts.append(("kernel version", f"{e(r['kernel_version'])} {stale_badge(v)}"))
    head = (
        f"<h3>{e(r['kernel'])} <span class=sig>{sig(r['signature'])}</span> on "
        f"{e(r['device_kind'])} ({e(r['backend'])})</h3>"
    )
    body = "<dl class=facts>" + "".join(f"<dt>{a}</dt><dd>{b}</dd>" for a, b in facts) + "</dl>"
    if not charts:
        body += "<p class=small>No trials are stored with this entry (imported or merged).</p>"
    figures = "<div class=charts>" + "".join(figure(c, pngs) for c in charts) + "</div>"
    return (
        f"<section class=entry id='e-{v.anchor}'>{head}{body}{figures}"
        "<p class=small><a href='#overview'>back to the overview</a></p></section>"
    )
