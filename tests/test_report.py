"""`autotune report`: an HTML report with SVG charts, and PNGs where matplotlib is installed."""

import re
import xml.etree.ElementTree as ET

import pytest

from autotune import TuningDB
from autotune.cli import main
from autotune.report import param_importances
from autotune.signature import TuningKey
from autotune.trial import BestEntry, TrialRecord

KEY = TuningKey("matmul", "v1", "cpu", "cpu", "interpret", "f32[64,64],f32[64,64]")


def time_of(config):  # block_m matters a lot, block_k a little
    return 1e-3 * (1 + config["block_m"] / 16) * (1 + config["block_k"] / 1000)


@pytest.fixture
def tuned(db_url):
    configs = [{"block_m": m, "block_k": k} for m in (16, 32, 64) for k in (32, 64, 128)]
    trials = [TrialRecord(c, "ok", time_s=time_of(c)) for c in configs]
    trials.append(TrialRecord({"block_m": 8, "block_k": 8}, "rejected"))
    with TuningDB(db_url) as db:
        ids = db.add_trials(KEY, "run", trials)
        best = min(range(len(configs)), key=lambda i: time_of(configs[i]))
        db.put_best(
            KEY,
            BestEntry(
                configs[best],
                time_s=time_of(configs[best]),
                default_time_s=3 * time_of(configs[best]),
                speedup=3.0,
                n_trials=len(trials),
                n_rejected=1,
                trial_id=ids[best],
                run_id="run",
                strategy="tpe",
            ),
        )
    return db_url


def test_importances_rank_the_parameter_that_matters_first(tuned):
    trials = [t.as_row() for t in TuningDB(tuned).trials() if t.status == "ok"]
    imp = param_importances(trials)
    assert list(imp) == ["block_m", "block_k"] and imp["block_m"] > 0.9
    assert sum(imp.values()) == pytest.approx(1.0)
    assert param_importances(trials[:2]) == {}


def test_report_writes_html_with_every_chart(tuned, tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["report", "--kernel", "matmul", "--out", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    page = (out / "index.html").read_text()
    assert "matmul f32[64,64],f32[64,64] on cpu (interpret)" in page
    assert "best block_k=32 block_m=16" in page and "speedup 3.00x" in page
    svgs = re.findall(r"<svg.*?</svg>", page, re.S)
    titles = [ET.fromstring(s).find("{http://www.w3.org/2000/svg}title").text for s in svgs]
    assert len(titles) == 4
    what = "matmul f32[64,64],f32[64,64]: "
    assert titles[0].startswith(what + "optimisation history")
    assert titles[1].startswith(what + "parameter importances")
    assert titles[2].startswith(what + "best time (ms) over block_m x block_k")
    assert titles[3] == "matmul: speedup over the default configuration per shape"
    assert svgs[2].count("<rect") == 1 + 9  # background + one cell per measured pair
    assert main(["report", "--kernel", "nothing", "--out", str(tmp_path / "empty")]) == 0
    assert "No tuned entries match" in (tmp_path / "empty" / "index.html").read_text()


def test_report_pngs_with_matplotlib(tuned, tmp_path):
    pytest.importorskip("matplotlib", reason="PNGs need the `report` extra (matplotlib)")
    out = tmp_path / "report"
    assert main(["report", "--out", str(out)]) == 0
    pngs = sorted(p.name for p in out.glob("*.png"))
    name = "matmul_f32_64_64_f32_64_64_cpu"
    assert pngs == [
        f"{name}_heatmap.png",
        f"{name}_history.png",
        f"{name}_importance.png",
        "matmul_speedup.png",
    ]
    assert all((out / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    page = (out / "index.html").read_text()
    assert all(f'<a href="{p}">PNG</a>' in page for p in pngs)


def test_an_entry_without_trials_has_no_history_and_long_labels_stay_inside(tmp_path):
    from test_db_tools import key, put

    from autotune import report

    db = TuningDB(tmp_path / "t.db")
    long_signature = ",".join(["bf16[4,16,2048,128]"] * 3)
    put(db, key(long_signature), 16, 1e-3)
    put(db, key("f32[8,128]"), 8, 1e-3)
    doc = db.export()
    merged = TuningDB(tmp_path / "merged.db")
    merged.import_entries(doc)  # entries without their trials
    sections = report.build(merged)
    assert [c.kind for _, charts in sections for c in charts] == ["speedup"]
    (speedup,) = sections[-1][1]
    labels = re.findall(
        r'<text x="([\d.]+)" y="[\d.]+" text-anchor="(\w+)" >([^<]*)</text>', speedup.svg
    )
    assert any(anchor == "end" for _, anchor, _ in labels)  # the pattern still finds labels
    for x, anchor, text in labels:
        if anchor == "end":  # a label ending at x: its start must lie inside the chart
            assert float(x) - len(text) * report.LABEL_CHAR_PX >= 0, text


def test_png_titles_fit_the_figure(tuned):
    pytest.importorskip("matplotlib", reason="PNGs need the `report` extra (matplotlib)")
    import matplotlib.pyplot as plt
    from matplotlib.text import Text

    from autotune import report

    for _, charts in report.build(TuningDB(tuned)):
        for chart in charts:
            fig = report.draw_png(chart)
            fig.canvas.draw()
            (title,) = [
                t for t in fig.findobj(Text) if t.get_text().replace("\n", " ") == chart.title
            ]
            box = title.get_window_extent()
            assert box.x0 >= 0 and box.x1 <= fig.bbox.x1 and box.y1 <= fig.bbox.y1, chart.title
            plt.close(fig)
