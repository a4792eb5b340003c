"""`autotune report`: the overview first, a program's calls as one view, devices side by side,
charts with axes and every trial status, PNGs (matplotlib is in the test extra), and the page
as a browser shows it (where Chromium is installed)."""

from __future__ import annotations

import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest

from autotune import TuningDB, report
from autotune.cli import main
from autotune.report.entries import param_importances
from autotune.signature import TuningKey
from autotune.trial import BestEntry, TrialRecord

BENCHMARKS = str(Path(__file__).resolve().parent.parent / "benchmarks")
if BENCHMARKS not in sys.path:
    sys.path.insert(0, BENCHMARKS)
import report_example  # noqa: E402  (the example report's screenshot and blank check)
import train_step  # noqa: E402  (the training-step benchmark's transformer block)

SVG = "{http://www.w3.org/2000/svg}"
H100, V5E = "NVIDIA H100 80GB HBM3", "TPU v5 lite"


def key(kernel="matmul", kind=H100, signature="f32[64,64],f32[64,64]", version="v1"):
    platform, backend = ("gpu", "triton") if kind.startswith("NVIDIA") else ("tpu", "mosaic_tpu")
    return TuningKey(kernel, version, platform, kind, backend, signature)


def time_of(config, kind=H100):  # block_m matters a lot, block_k a little; each kind its best
    best_m = 32 if kind == H100 else 64
    return 1e-4 * (1 + abs(config["block_m"] - best_m) / 16) * (1 + config["block_k"] / 1000)


def tune_into(db, k, trials, default_factor=3.0):
    """Store trials and the best entry of key `k`, as a tuning run would."""
    ids = db.add_trials(k, "run", trials)
    ok = [i for i, t in enumerate(trials) if t.status == "ok"]
    best = min(ok, key=lambda i: trials[i].time_s)
    t = trials[best].time_s
    db.put_best(k, BestEntry(trials[best].config, time_s=t, default_time_s=default_factor * t,
                             speedup=default_factor, n_trials=len(trials), trial_id=ids[best],
                             n_rejected=sum(t.status == "rejected" for t in trials),
                             run_id="run", strategy="gp"))  # fmt: skip
    return ids


GRID = [{"block_m": m, "block_k": k} for m in (16, 32, 64) for k in (32, 64, 128)]


@pytest.fixture
def fleet(db_url):
    """matmul tuned on an H100 (9 measured trials, a rejected, a crashed, a duplicate; each
    trial names its device and memory) and on a TPU (older rows: no device, no memory), softmax
    on the H100 with 3 trials: two kernels, two device kinds."""
    with TuningDB(db_url) as db:
        gpu = [TrialRecord(c, "ok", time_s=time_of(c), device=f"gpu:{i % 2}",
                           memory_peak_bytes=(1 + i) * 2**20) for i, c in enumerate(GRID)]  # fmt: skip
        gpu += [TrialRecord({"block_m": 8, "block_k": 8}, "rejected", device="gpu:0"),
                TrialRecord({"block_m": 128, "block_k": 8}, "crashed", device="gpu:1")]  # fmt: skip
        ids = tune_into(db, key(), gpu)
        db.add_trials(key(), "run", [TrialRecord(GRID[0], "duplicate", duplicate_of=ids[0])])
        tune_into(db, key(kind=V5E), [TrialRecord(c, "ok", time_s=time_of(c, V5E)) for c in GRID])
        rows = [{"block_rows": r} for r in (8, 16, 32)]
        tune_into(db, key("softmax", signature="f32[8,128]"),
                  [TrialRecord(c, "ok", time_s=1e-5 * c["block_rows"]) for c in rows], 1.5)  # fmt: skip
    return db_url


class Page(HTMLParser):
    """The elements of a page in document order: (tag, attributes, text directly inside)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.elements: list[list] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.elements.append([tag, dict(attrs), ""])

    def handle_data(self, data):
        if self.elements:
            self.elements[-1][2] += data

    def position(self, **attrs) -> int:
        return next(i for i, (_, a, _) in enumerate(self.elements) if attrs.items() <= a.items())

    def first(self, tag: str) -> int:
        return next(i for i, (t, _, _) in enumerate(self.elements) if t == tag)


def rows_of(page: str, table_id: str) -> list[str]:
    body = re.search(rf"<table[^>]*id={table_id}>.*?<tbody>(.*?)</tbody>", page, re.S).group(1)
    return re.findall(r"<tr.*?</tr>", body, re.S)


def test_importances_rank_the_parameter_that_matters_first(fleet):
    trials = [t.as_row() for t in TuningDB(fleet).trials(device_kind=H100) if t.status == "ok"]
    imp = param_importances(trials)
    assert list(imp) == ["block_m", "block_k"] and imp["block_m"] > 0.9
    assert sum(imp.values()) == pytest.approx(1.0)
    assert param_importances(trials[:2]) == {}


def test_the_overview_comes_first_with_a_row_and_a_link_per_entry(fleet, tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["report", "--out", str(out), "--no-png"]) == 0
    assert "wrote" in capsys.readouterr().out
    text = (out / "index.html").read_text()
    page = Page(text)
    entries = TuningDB(fleet).query()
    rows = rows_of(text, "overview-table")
    assert len(entries) == len(rows) == 3
    links = [re.search(r'href="#(e-[^"]+)"', r).group(1) for r in rows]
    assert len(set(links)) == 3
    table = page.position(id="overview-table")
    assert table < page.first("svg") and table < page.first("figure")
    for anchor in links:  # each link leads to its entry's section, after the overview
        assert page.position(id=anchor) > table
        assert page.elements[page.position(id=anchor)][0] == "section"
    # the totals above the table: entries, kernels, device kinds, trials by status
    cards = re.findall(r"<div class=card><b>([^<]*)</b><span>([^<]*)</span>", text)
    assert cards[:4] == [("3", "entries"), ("2", "kernels"), ("2", "device kinds"),
                         ("24", "trials: 1 rejected, 1 failed, 1 duplicate")]  # fmt: skip
    h100 = next(r for r in rows if H100 in r and "matmul" in r)
    cells = re.findall(r"<td[^>]*>(.*?)</td>", h100, re.S)
    assert "gpu:0, gpu:1" in cells[2]  # the devices that measured it
    best = min(time_of(c) for c in GRID)
    assert cells[4:8] == [f"{best * 1e6:.3g} µs", f"{3 * best * 1e6:.3g} µs",
                          '<span class=spd style="--w:67%">3.00x</span>', "12"]  # fmt: skip
    assert cells[8:11] == ["1", "1", "4 MiB"]  # rejected, failed, the best trial's peak memory
    tpu = next(r for r in rows if V5E in r)
    assert re.findall(r"<td[^>]*>(.*?)</td>", tpu, re.S)[10] == "n/a"  # no memory recorded
    assert "stale" in h100  # tuned for version v1, the registered matmul is another version
    # a kernel with no entries is refused as `db export` refuses it: an empty page would pass
    assert main(["report", "--kernel", "nothing", "--out", str(tmp_path / "empty")]) == 2
    assert not (tmp_path / "empty").exists()


def test_devices_side_by_side_show_the_configurations_that_differ(fleet):
    with TuningDB(fleet) as db:
        page = report.build(db)
    (matmul,) = page.comparisons  # softmax is tuned on one device kind only
    assert list(matmul.by_device) == [H100, V5E] and matmul.differing == ("block_m",)
    assert page.devices.data["cells"] == {
        "matmul": {H100: pytest.approx(3.0), V5E: pytest.approx(3.0)},
        "softmax": {H100: pytest.approx(1.5)},
    }
    texts = [t.text for t in ET.fromstring(page.devices.svg).iter(f"{SVG}text")]
    assert texts.count("3.00x") == 2 and "1.50x" in texts and "not tuned" in texts
    html = report.page.comparisons_html(page.comparisons)
    assert "block_k=32 <b>block_m=32</b>" in html and "block_k=32 <b>block_m=64</b>" in html


def test_the_history_marks_each_status_apart_on_axes_with_ticks_and_units(fleet):
    with TuningDB(fleet) as db:
        page = report.build(db, kernel="matmul")
    gpu = next(v for v in page.views if v.entry["device_kind"] == H100)
    history, importance, heatmap = page.charts[gpu.anchor]
    root = ET.fromstring(history.svg)
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert "time (µs)" in texts and "trial" in texts and "not timed" in texts
    assert {"measured", "duplicate", "rejected", "failed", "fastest so far", "stored"} <= set(texts)
    assert {"5", "10"} <= set(texts)  # the trial axis's ticks
    circles = list(root.iter(f"{SVG}circle"))
    measured = [c for c in circles if c.get("fill") == "#4878cf"]
    rings = [c for c in circles if c.get("stroke") == "#888"]
    stored = [c for c in circles if c.get("stroke") == "#222"]
    assert len(measured) == 9 + 1 and len(rings) == len(stored) == 1 + 1  # and in the legend
    # the duplicate sits at the time of the trial it repeats (the first); the stored one circled
    assert rings[0].get("cy") == measured[0].get("cy")
    best = min(range(9), key=lambda i: time_of(GRID[i]))
    assert (stored[0].get("cx"), stored[0].get("cy")) == (
        measured[best].get("cx"),
        measured[best].get("cy"),
    )
    for t in root.iter(f"{SVG}text"):  # every label inside the chart
        x, n = float(t.get("x")), len(t.text) * report.svg.LABEL_CHAR_PX
        start = {"start": x, "middle": x - n / 2, "end": x - n}[t.get("text-anchor")]
        assert start >= 0 and start + n <= report.svg.W or "rotate" in t.get("transform", "")
    assert history.data["points"][-1] == (12, "duplicate", time_of(GRID[0]))
    assert [p[1] for p in history.data["points"][9:11]] == ["rejected", "failed"]
    assert importance.kind == "importance" and heatmap.kind == "heatmap"
    cells = [r for r in ET.fromstring(heatmap.svg).iter(f"{SVG}rect") if r.get("width") != "520"]
    assert len([r for r in cells if r.get("stroke") == "black"]) == 1  # the best pair, outlined
    tpu = next(v for v in page.views if v.entry["device_kind"] == V5E)
    assert [c.kind for c in page.charts[tpu.anchor]] == ["history", "importance", "heatmap"]


def test_a_search_too_short_for_a_landscape_shows_its_history_only(fleet):
    with TuningDB(fleet) as db:
        page = report.build(db, kernel="softmax")
    (view,) = page.views
    assert len(view.trials) < report.MIN_LANDSCAPE_TRIALS
    assert [c.kind for c in page.charts[view.anchor]] == ["history"]
    assert [c.kind for c in page.speedups] == ["speedup"] and page.devices is None


def test_entries_without_trials_and_long_labels(tmp_path):
    from test_db_tools import key as scale_key
    from test_db_tools import put

    db = TuningDB(tmp_path / "t.db")
    long_signature = ",".join(["bf16[64,16,2048,128]"] * 3)  # 64 rows: 16 divides them
    put(db, scale_key(long_signature), 16, 1e-3)
    put(db, scale_key("f32[8,128]"), 8, 1e-3)
    merged = TuningDB(tmp_path / "merged.db")
    merged.import_entries(db.export())  # entries without their trials
    page = report.build(merged)
    assert [c for v in page.views for c in page.charts[v.anchor]] == []
    (speedup,) = page.speedups
    text = report.page.render(page, set())
    assert "No trials are stored with this entry" in text
    rows = rows_of(text, "overview-table")
    assert all(re.findall(r"<td class=num[^>]*>([^<]*)</td>", r)[4] == "n/a" for r in rows)
    labels = [
        t for t in ET.fromstring(speedup.svg).iter(f"{SVG}text") if t.get("text-anchor") == "end"
    ]
    assert labels
    for t in labels:  # a label ending at x: its start lies inside the chart
        assert float(t.get("x")) - len(t.text) * report.svg.LABEL_CHAR_PX >= 0, t.text


def test_the_page_loads_nothing_from_the_network(fleet, tmp_path):
    index, _ = report.write(TuningDB(fleet), tmp_path / "r", pngs=False)
    text = index.read_text()
    assert not re.search(r"<(link|img|iframe|object|embed)\b|@import|url\(", text)
    assert re.findall(r"https?://[^\"' )]+", text) == ["http://www.w3.org/2000/svg"] * text.count(
        "<svg"
    )
    assert "<script>" in text and "<script src" not in text


def test_what_a_row_holds_is_shown_as_text_never_run(db_url, tmp_path):
    hostile = "<img src=x onerror=alert(1)>"
    k = TuningKey("matmul", "v1", "gpu", f"GPU {hostile}", "triton", "f32[8,8]",
                  '{"note":"</script><script>alert(1)</script>"}')  # fmt: skip
    with TuningDB(db_url) as db:
        tune_into(db, k, [TrialRecord({"block_m": 8, "block_k": 8}, "ok", time_s=1e-5,
                                      device=hostile)])  # fmt: skip
    index, _ = report.write(TuningDB(db_url), tmp_path / "r", pngs=False)
    text = index.read_text()
    assert "<img" not in text and "alert(1)</script>" not in text
    assert text.count("<script>") == 1 and "&lt;img src=x onerror=alert(1)&gt;" in text


def test_pngs_of_every_chart(fleet, tmp_path):
    out = tmp_path / "report"
    assert main(["report", "--out", str(out)]) == 0
    pngs = sorted(p.name for p in out.glob("*.png"))
    gpu = "matmul_f32_64_64_f32_64_64_NVIDIA_H100_80GB_HBM3"
    assert f"{gpu}_history.png" in pngs and f"{gpu}_heatmap.png" in pngs
    assert {"matmul_speedup.png", "softmax_speedup.png", "speedup_by_device_kind.png"} <= set(pngs)
    assert (
        len(pngs) == 3 + 3 + 1 + 2 + 1
    )  # two matmul entries, softmax's history, speedups, devices
    assert all((out / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    page = (out / "index.html").read_text()
    assert all(f'<a href="{p}">PNG</a>' in page for p in pngs)
    assert "need matplotlib" not in page


def test_png_titles_fit_the_figure(fleet):
    import matplotlib.pyplot as plt
    from matplotlib.text import Text

    for chart in report.build(TuningDB(fleet)).all_charts:
        fig = report.draw_png(chart)
        fig.canvas.draw()
        (title,) = [t for t in fig.findobj(Text) if t.get_text().replace("\n", " ") == chart.title]
        box = title.get_window_extent()
        assert box.x0 >= 0 and box.x1 <= fig.bbox.x1 and box.y1 <= fig.bbox.y1, chart.title
        plt.close(fig)


@pytest.fixture
def step_db(db_url, monkeypatch):
    """train_step's tiny step (10 calls, traced, nothing run); 3 of its calls tuned in the
    database with chosen times, one of them saving more than the others."""
    import autotune
    from autotune.registry import resolve

    monkeypatch.syspath_prepend(BENCHMARKS)
    calls = autotune.calls_in(*train_step.tiny())
    times = {1: (4e-4, 1e-4), 2: (2e-4, 1.5e-4), 5: (1e-4, 0.9e-4)}  # call index: default, tuned
    with TuningDB(db_url) as db:
        for i, (default_s, tuned_s) in times.items():
            c = calls[i]
            k = TuningKey(**resolve(c.kernel).explain(*c.args, **c.kwargs)["key"])
            db.put_best(k, BestEntry(c.config, time_s=tuned_s, default_time_s=default_s,
                                     speedup=default_s / tuned_s, n_trials=4, run_id="run",
                                     strategy="gp"))  # fmt: skip
    autotune.configure()  # calls are looked up again
    return calls, times


def test_a_programs_page_names_every_call_and_the_steps_total_before_and_after(
    step_db, tmp_path, capsys
):
    calls, times = step_db
    out = tmp_path / "step"
    assert main(["report", "--program", "train_step:tiny", "--out", str(out), "--no-png"]) == 0
    text = (out / "index.html").read_text()
    page = Page(text)
    assert page.position(id="program") < page.position(id="overview")
    rows = rows_of(text, "program-table")
    assert len(rows) == len(calls) == 10
    for c in calls:  # every call named, with its signature and where it is served from
        assert any(f">{c.kernel}<" in r and c.signature.replace("],", "],<wbr>") in r for r in rows)
    before, after = (sum(t[k] for t in times.values()) for k in (0, 1))
    cards = re.findall(r"<div class=card><b>([^<]*)</b><span>([^<]*)</span>", text)
    # coverage first: the step makes 11 calls (one matmul twice), 3 of them tuned and timed;
    # the totals are those 3 calls', said so on each
    assert cards[0] == ("3 of 11", "calls tuned here, with both times (the totals cover these)")
    assert cards[1:4] == [
        (f"{before * 1e6:.3g} µs", "their kernel time at the defaults (3 calls)"),
        (f"{after * 1e6:.3g} µs", "their kernel time tuned (3 calls)"),
        (f"{before / after:.2f}x", "speedup of those 3 calls"),
    ]
    assert "Program train_step:tiny: 11 calls (10 distinct)" in text
    # what to run next, for the 8 calls served the default or a nearest shape
    coverage = re.search(r"<p class=coverage>(.*?)</p>", text).group(1)
    assert coverage.startswith("8 of the 11 calls have no tuned time to compare here")
    assert "To tune the 8" in coverage
    assert "<code class=next>autotune tune --program train_step:tiny</code>" in coverage
    # the calls that save most first (call 2, then 3, then 6: 1-based), then the untuned in order
    order = [int(re.search(r'data-v="(\d+)"', r).group(1)) for r in rows]
    assert order == [2, 3, 6, 1, 4, 5, 7, 8, 9, 10]
    sources = [re.search(r"class='badge (\w+)'", r).group(1) for r in rows]
    assert sources[:3] == ["db"] * 3 and set(sources[3:]) == {"default", "nearest"}
    assert all("not tuned" in r for r in rows[3:])
    # the tuned calls link to their entries' sections; only those entries are shown
    assert len(rows_of(text, "overview-table")) == 3
    assert all(re.search(r'href="#e-[^"]+"', r) for r in rows[:3])
    rc = main(["report", "--program", "train_step:tiny", "--kernel", "matmul", "--out", str(out)])
    assert rc == 2 and "not allowed with argument" in capsys.readouterr().err


def test_tune_programs_outcomes_make_the_same_view(step_db, tmp_path):
    import autotune
    from autotune.service.program import program_tasks
    from autotune.service.progress import Outcome
    from autotune.tuning.settings import TuneSettings

    _, times = step_db
    calls = autotune.calls_in(*train_step.tiny())  # listed again: served from the database now
    outcomes = [Outcome(t, "skipped") for t in program_tasks(calls, TuneSettings())]
    with TuningDB() as db:
        index, _ = report.write(db, tmp_path / "r", program=outcomes, pngs=False)
        from_calls = report.build(db, program=calls).program
    view = report.build(TuningDB(), program=outcomes).program
    assert [(r.kernel, r.signature, r.source, r.tuned_s) for r in view.rows] == [
        (r.kernel, r.signature, r.source, r.tuned_s) for r in from_calls.rows
    ]
    assert view.before_s == pytest.approx(sum(t[0] for t in times.values()))
    assert "Program the program: 10 calls" in index.read_text()


needs_chromium = pytest.mark.skipif(
    report_example.chromium() is None,
    reason="Chromium is not installed (apt-get install chromium): no screenshot of the report",
)


@needs_chromium
def test_a_screenshot_of_the_report_is_not_blank_and_its_filter_works(fleet, tmp_path):
    index, _ = report.write(TuningDB(fleet), tmp_path / "r", pngs=False)
    shot = tmp_path / "shot.png"
    report_example.screenshot(index, shot, 1280, 900)
    assert report_example.blank(shot) is None
    # a white page is blank
    white = tmp_path / "white.html"
    white.write_text("<!doctype html><body style='background:#fff'></body>")
    report_example.screenshot(white, tmp_path / "white.png", 400, 300)
    assert "not white" in report_example.blank(tmp_path / "white.png")
    # the page's script ran in the browser: `#q=softmax` filtered the overview to one entry
    dom = subprocess.run(
        [report_example.chromium(), *report_example.CHROMIUM_FLAGS,
         f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", index.as_uri() + "#q=softmax"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    assert "1 of 3 entries" in dom
    shown = [r for r in rows_of(dom, '"overview-table"') if " hidden" not in r.split(">")[0]]
    assert len(shown) == 1 and "softmax" in shown[0]
    assert 'aria-sort="none"' in dom  # the column heads were made sortable


def test_the_cli_refuses_a_program_that_cannot_be_loaded(db_url, tmp_path, capsys):
    TuningDB(db_url).close()
    rc = main(["report", "--program", "train_step:nothing", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "has no function 'nothing'" in err


def test_the_readme_shows_a_small_picture_of_a_report():
    root = Path(__file__).resolve().parent.parent
    assert (
        "![The report of a training step tuned on a CPU](docs/report.png)"
        in (root / "README.md").read_text()
    )
    picture = root / "docs" / "report.png"
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert picture.stat().st_size < 200_000
    assert report_example.blank(picture) is None


def test_a_program_report_counts_calls_made_twice_and_shows_their_mesh_axes(step_db, tmp_path):
    import dataclasses

    import autotune
    from autotune.registry import resolve

    calls, times = step_db
    twice = calls[3]  # the attention output's matmul: the step makes it twice
    assert twice.count == 2 and sum(c.count for c in calls) == 11
    k = TuningKey(**resolve(twice.kernel).explain(*twice.args, **twice.kwargs)["key"])
    with TuningDB() as db:
        db.put_best(k, BestEntry(twice.config, time_s=1e-4, default_time_s=3e-4, speedup=3.0,
                                 n_trials=4, run_id="run", strategy="gp"))  # fmt: skip
    autotune.configure()
    mapped = dataclasses.replace(autotune.calls_in(*train_step.tiny())[0], mesh_axes={"d": 4})
    listed = [mapped, *autotune.calls_in(*train_step.tiny())[1:]]
    with TuningDB() as db:
        view = report.program_view(db, listed, "train_step:tiny")
    before = sum(t[0] for t in times.values()) + 2 * 3e-4  # the twice-made call counts twice
    assert (view.n_timed, view.n_calls) == (5, 11)
    assert view.before_s == pytest.approx(before)
    assert view.after_s == pytest.approx(sum(t[1] for t in times.values()) + 2 * 1e-4)
    text = report.page.program_html(view, {})
    rows = rows_of(text, "program-table")
    assert rows[0].count(">matmul<") == 1 and re.search(r'<td class=num data-v="2">2</td>', rows[0])
    assert "per device, over mesh axes d=4" in next(r for r in rows if ">layer_norm<" in r)
    # the table scrolls in a box of its own rather than squeezing its signature column
    assert "<div class=wide><table class=sortable id=program-table>" in text
    css = report.assets.CSS
    assert ".wide{overflow-x:auto}" in css and "td.sig{min-width:22ch" in css
    assert "overflow-wrap:anywhere" not in css  # which lets a column shrink to a character


def test_the_history_draws_the_defaults_own_trial_and_writes_the_side_by_side_figures(db_url):
    k = key(signature="f32[32,64],f32[64,64]")
    times = [85e-6, 90e-6, 80e-6, 95e-6]  # first pass, on a busy device
    trials = [TrialRecord(c, "ok", time_s=t, is_default=i == 0)
              for i, (c, t) in enumerate(zip(GRID, times))]  # fmt: skip
    with TuningDB(db_url) as db:
        ids = db.add_trials(k, "run", trials)
        # the finalists, re-measured side by side: faster than any first-pass figure
        db.put_best(k, BestEntry(GRID[2], time_s=40e-6, default_time_s=49.5e-6, speedup=1.24,
                                 n_trials=4, trial_id=ids[2], run_id="run", strategy="gp"))  # fmt: skip
        (view,) = report.build(db).views
    (history,) = report.entry_charts(view)
    root = ET.fromstring(history.svg)
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert "side by side (finalists): default 49.5 µs, stored 40 µs" in texts
    assert "default's trial" in texts and "default" not in texts
    dashed = [el for el in root.iter(f"{SVG}line") if el.get("stroke-dasharray") == "5 3"]
    default_point = [c for c in root.iter(f"{SVG}circle") if c.get("fill") == "#4878cf"][0]
    assert [float(d.get("y1")) for d in dashed] == [float(default_point.get("cy"))]
    assert history.data["default_s"] == 85e-6 and "first pass" in history.title
