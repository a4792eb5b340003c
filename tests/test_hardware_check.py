"""The prepared accelerator check: its budget plan, and its smoke mode (the same code on this CPU,
tiny shapes) ending within a budget too small for every case."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "hardware_check.py"


@pytest.fixture(scope="module")
def hc():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import hardware_check

        yield hardware_check
    finally:
        sys.path.remove(str(SCRIPT.parent))


def test_the_plan_keeps_cases_in_order_of_value_and_drops_what_no_longer_fits(hc):
    o = hc.Overheads(
        start_s=10.0,
        check_s={"float32": 20.0, "bfloat16": 5.0},
        tune_past_limit_s=10.0,
        side_by_side_s=10.0,
        compile_s={"float32": 10.0},
        min_tune_s=20.0,
        report_s=1.0,
        extras_s={"readme": 40.0},  # with the start-up: 50 s
    )
    big = hc.Case("matmul", ((8, 8), (8, 8)), None, "bfloat16", share=3.0)
    f32 = hc.Case("matmul", ((8, 8), (8, 8)), None, "float32", share=1.0)
    small = hc.Case("softmax", ((8, 8),), None, "bfloat16", share=0.5)
    mgpu = hc.Case("matmul_mgpu", ((8, 8), (8, 8)), None, "bfloat16", share=1.0)
    todo = hc.steps(
        [mgpu, big, f32, small], ("float32", "bfloat16"), smoke=False, extras=["readme"]
    )
    # Mosaic GPU last, then the README example; a kernel is checked by its first case only
    assert [s.label for s in todo] == [
        "matmul bfloat16",
        "matmul float32",
        "softmax bfloat16",
        "matmul_mgpu bfloat16",
        "README example",
    ]
    assert [s.checks for s in todo[:4]] == [
        ("float32", "bfloat16"),
        (),
        ("float32", "bfloat16"),
        ("bfloat16",),
    ]
    costs = [hc.step_cost(s, o) for s in todo]
    # start, two checks, the tune's overrun and the side by side (+2 float32 compiles for f32)
    assert costs == [55.0, 50.0, 55.0, 35.0, 50.0]
    # big needs 55 + 60, f32 50 + 20, small 55 + 10, mgpu 35 + 20: 316 s holds all but the
    # example; the 11 s left over go by share (3 : 1 : 0.5 : 1)
    plan = hc.plan(todo, 316.0, o)
    assert sorted(plan) == [0, 1, 2, 3]
    assert plan[0] == pytest.approx(66.0) and plan[2] == pytest.approx(11.0)
    # 150 s: big (115) fits, f32 (70) does not, small (65) does not, mgpu (55) does not ...
    assert hc.plan(todo, 150.0, o) == {0: pytest.approx(150.0 - 55.0)}
    # ... but a later, cheaper step still fits where an earlier one does not
    assert sorted(hc.plan(todo, 175.0, o)) == [0, 3]
    assert hc.plan(todo, 50.0, o) == {4: 0.0}  # the example alone
    assert hc.plan(todo, 40.0, o) == {}


@pytest.mark.slow
def test_the_smoke_run_ends_within_its_budget_and_lists_what_it_dropped(tmp_path, subprocess_env):
    budget = 30.0
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--budget-s", str(budget), "--out", str(tmp_path)],
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=5 * budget,
    )
    wall = time.perf_counter() - start
    assert wall <= budget * 1.05 + 2.0, proc.stdout[-3000:]  # +2: this interpreter's start
    (report,) = tmp_path.glob("*.json")

    def no_nan(text):  # JSON's NaN would be a time that is not one
        raise AssertionError(f"{text} in the report")

    doc = json.loads(report.read_text(), parse_constant=no_nan)
    text = (tmp_path / f"{report.stem}.md").read_text()
    assert text.startswith("# Hardware check: cpu")
    rows = doc["cases"]
    # every case is listed, in order of value, the first one run
    assert rows[0]["case"] == "matmul bfloat16" and rows[-1]["case"] == "matmul_mgpu bfloat16"
    first = rows[0]
    assert first["outcome"] == "done", proc.stdout[-3000:] + proc.stderr[-3000:]
    assert {(c["dtype"], c["ok"]) for c in first["correctness"]} == {
        ("float32", True),
        ("bfloat16", True),
    }
    assert first["rc"] == 0 and first["tuned_ok"] and first["timer"] == "wall"
    assert all(
        first[f"{n}_s"] > 0 and math.isfinite(first[f"{n}_s"])
        for n in ("default", "tuned", "vendor")
    )
    # what ran finished and the rest was dropped for budget: how many ran depends on the host's
    # speed (the plan is made again from the time left before each step), never all of them
    dropped = [r["case"] for r in rows if r["outcome"] == "not run: budget"]
    assert all(r["outcome"] in ("done", "not run: budget") for r in rows), proc.stdout[-3000:]
    assert dropped, proc.stdout[-3000:]
    assert f"- {dropped[0]}: not run: budget" in text
    assert proc.returncode == 0, proc.stdout[-3000:]


def test_a_case_past_its_timeout_is_stopped_and_says_where_it_was(hc, tmp_path):
    step = hc.Step(hc.CASES[0], ("float32",), True)
    job = hc.job(step, 5.0, str(tmp_path / "check.db"), smoke=True, overheads=hc.OVERHEADS["cpu"])
    start = time.perf_counter()
    result = hc.run_step(job, 1.0, tmp_path)  # less than its process needs to start
    assert time.perf_counter() - start < 5.0
    assert result["outcome"].startswith("timeout after 1 s (during ")
    assert "default_s" not in result
