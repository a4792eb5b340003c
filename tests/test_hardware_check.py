"""The prepared accelerator check: its budget plan, and its smoke mode (the same code on this CPU,
tiny shapes) ending within a budget too small for every case."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import jax.numpy as jnp
import pytest

import autotune

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


def test_the_plan_keeps_steps_in_order_of_value_and_drops_what_no_longer_fits(hc):
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
    readme = hc.Extra("readme", "README example")
    todo = hc.steps([big, mgpu, readme, f32, small], ("float32", "bfloat16"), False, o)
    # in the order given; a case checks its own dtype, a kernel's last case also the dtypes no
    # case of it covers (softmax: float32 too; matmul_mgpu: 16-bit only)
    assert [s.label for s in todo] == [
        "matmul bfloat16",
        "matmul_mgpu bfloat16",
        "README example",
        "matmul float32",
        "softmax bfloat16",
    ]
    assert [s.checks for s in todo] == [
        ("bfloat16",),
        ("bfloat16",),
        (),
        ("float32",),
        ("float32", "bfloat16"),
    ]
    costs = [hc.step_cost(s, o) for s in todo]
    # start, checks, the tune's overrun and the side by side (+2 float32 compiles for f32)
    assert costs == [35.0, 35.0, 50.0, 70.0, 55.0]
    # big needs 35 + 60, mgpu 35 + 20, the example 50, f32 70 + 20, small 55 + 10: 355 s hold
    # all; of 375 s the 20 s left over go to the cases by share (3 : 1 : 1 : 0.5)
    plan = hc.plan(todo, 375.0, o)
    assert sorted(plan) == [0, 1, 2, 3, 4]
    assert plan[0] == pytest.approx(60.0 + 20 * 3 / 5.5) and plan[2] == 0.0
    # 150 s: big (95) fits, mgpu (55) too, the example (50) does not ...
    assert sorted(hc.plan(todo, 150.0, o)) == [0, 1]
    # ... but a later, cheaper step still fits where an earlier one does not
    assert sorted(hc.plan(todo, 145.0, o)) == [0, 2]
    assert hc.plan(todo, 50.0, o) == {2: 0.0}  # the example alone
    assert hc.plan(todo, 40.0, o) == {}
    # smoke mode: no extras, and a Mosaic GPU kernel is checked, not tuned
    smoke = hc.steps([big, mgpu, readme], ("float32", "bfloat16"), True, o)
    assert [(s.label, s.tuned) for s in smoke] == [
        ("matmul bfloat16", False),
        ("matmul_mgpu bfloat16", False),
    ]


def _shipped_only(monkeypatch):
    """The registry as the script's own process has it: the shipped kernels, not those other
    test files registered in this process before (an order of files apart)."""
    from autotune import registry

    shipped = {
        name: kernel
        for name, kernel in registry.registered().items()
        if kernel.__module__.startswith("autotune.")
    }
    monkeypatch.setattr(registry, "_REGISTRY", shipped)


def _plan(hc, capsys, monkeypatch, device_kind, budget_s):
    """What `hardware_check.py --plan-only` prints, run in this process: a plan only reads the
    registry and the device kind given, so a process of its own would show nothing more."""
    _shipped_only(monkeypatch)
    # main sets it for the steps' processes it would start: kept to this test
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    capsys.readouterr()
    args = ["--plan-only", "--device-kind", device_kind, "--budget-s", str(budget_s)]
    assert hc.main(args) == 0
    out = capsys.readouterr().out
    rows = [  # | # | step | starts at s | planned s | of it search s | time limit s |
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in out.splitlines()
        if line[:4].strip("| ").isdigit()
    ]
    return out, [(r[1], r[3]) for r in rows], rows


def test_the_h100_plan_fits_the_bf16_cases_the_training_step_and_both_groups_in_540_s(
    hc, capsys, monkeypatch
):
    # on this CPU host, nothing touches a device: the plan the prepared command makes on an
    # H100, the wheel install counted
    text, planned, rows = _plan(hc, capsys, monkeypatch, "NVIDIA H100 80GB HBM3", 540)
    ran = [step for step, time_s in planned if time_s != "not run: budget"]
    assert ran[:8] == [
        "matmul bfloat16",
        "flash_attention bfloat16 causal=True",
        "flash_attention_dq bfloat16 causal=True",
        "flash_attention_dkv bfloat16 causal=True",
        "matmul_mgpu bfloat16",
        "training step",
        "variant group matmul_variants",
        "variant group attention_variants",
    ]
    first_f32 = next(i for i, (step, _) in enumerate(planned) if "float32" in step)
    assert all(i < first_f32 for i, (step, _) in enumerate(planned) if step in ran)
    assert "| - | install the carried wheels | 0 | 10 |" in text
    # each with a time limit, none past the budget's tolerance, the report within the budget
    for r in rows:
        if r[3] != "not run: budget":
            start, planned_s, limit = float(r[2]), float(r[3]), float(r[5])
            assert planned_s <= limit and start + limit <= 540 * 1.05
    end = float(re.search(r"the report written by (\d+) s", text).group(1))
    assert end <= 540
    assert sum(float(r[3]) for r in rows if r[3] != "not run: budget") + 20 <= end


def test_a_cases_tune_gets_what_its_step_has_left_after_its_checks_and_side_by_side(hc):
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import hardware_case
    finally:
        sys.path.remove(str(SCRIPT.parent))
    step = hc.Step(hc.CASES[0], ("bfloat16",), True)  # matmul bf16 on a GPU
    job = hc.job(step, 27.0, "db", smoke=False, info={"platform": "gpu"}, limit_s=96.0)
    job["started_at"] = 1000.0
    gpu = hc.OVERHEADS["gpu"]
    assert job["after_tune_s"] == gpu.check_s["bfloat16"] + gpu.side_by_side_s  # 26 s
    # 8 s into the step: 96 - 8 - 26 - 2 = 60 s left, its 27 s search and the tune's overrun fit
    assert hardware_case.tune_limits(job, 1008.0) == (27.0, 60.0)
    # 40 s into it (a slow start): the search shrinks to what leaves the side by side its time
    search, timeout = hardware_case.tune_limits(job, 1040.0)
    assert timeout == 28.0 and search == 28.0 - gpu.tune_past_limit_s
    assert 1040.0 + timeout + job["after_tune_s"] <= 1000.0 + 96.0
    assert hardware_case.tune_limits(job, 1060.0) is None  # nothing worth starting: skipped


def test_the_readmes_wheels_are_the_projects_dependency_tree_less_what_the_device_has():
    # the prepared GPU run installs the project with --no-deps from the wheels
    # benchmarks/README.md lists: every distribution the installed project needs on the
    # device (Python 3.12, Linux x86-64), walked through importlib.metadata, less what the
    # device machine has (JAX with CUDA, absl-py, rich, scipy, PyYAML, and what they need)
    from importlib import metadata

    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    env = {
        **default_environment(),
        "python_version": "3.12",
        "python_full_version": "3.12.1",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "implementation_name": "cpython",
        "extra": "",
    }

    def closure(names):
        seen, todo = set(), [canonicalize_name(n) for n in names]
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            for text in metadata.requires(name) or []:
                req = Requirement(text)
                if req.marker is None or req.marker.evaluate(env):
                    todo.append(canonicalize_name(req.name))
        return seen

    on_device = closure(["jax", "jaxlib", "absl-py", "rich", "scipy", "pyyaml"])
    needed = closure(["pallas-autotune"]) - on_device
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    section = readme[
        readme.index("### The prepared GPU run") : readme.index("### The prepared TPU")
    ]
    listed = set()
    for line in section.splitlines():
        words = line.split()
        if words[:2] in (["pip", "wheel"], ["pip", "download"]):
            values = {"-w", "-d", "--python-version", "--platform"}  # options with a value
            names = [w for i, w in enumerate(words[2:], 2)
                     if not w.startswith("-") and words[i - 1] not in values]  # fmt: skip
            listed |= {"pallas-autotune" if n == "." else canonicalize_name(n) for n in names}
    assert listed == needed
    # what the issue found missing from the earlier list is in it
    assert {"packaging", "typing-extensions", "tqdm", "markupsafe", "sqlalchemy"} <= listed


def test_the_tpu_plan_leaves_mosaic_gpu_out_and_says_so(hc, capsys, monkeypatch):
    text, planned, _ = _plan(hc, capsys, monkeypatch, "TPU v5 lite", 480)
    assert planned[0] == ("matmul bfloat16", planned[0][1]) and planned[0][1].isdigit()
    assert not any("mgpu" in step or "README" in step for step, _ in planned)
    assert "matmul_mgpu bfloat16: not run: a Mosaic GPU kernel needs a Hopper GPU" in text


def test_an_extra_shows_its_lines_as_they_come_and_stops_at_its_time_limit(hc, tmp_path):
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import hardware_case
    finally:
        sys.path.remove(str(SCRIPT.parent))
    seen = []
    code = "import time\nfor i in range(3): print('row', i)\ntime.sleep(30)"
    start = time.perf_counter()
    rc, lines, _ = hardware_case.stream(
        [sys.executable, "-c", code], 3.0, lambda got: seen.append(list(got))
    )
    assert rc is None and time.perf_counter() - start < 10  # stopped, not waited for
    assert lines == ["row 0", "row 1", "row 2"] and seen[0] == ["row 0"] and len(seen) == 3
    failing = "import sys\nprint('row'); sys.exit('a fault in the script')"
    rc, lines, errors = hardware_case.stream([sys.executable, "-c", failing], 30.0, lambda _: None)
    assert (rc, lines, errors) == (1, ["row"], "a fault in the script")


def test_the_plan_has_a_case_of_every_kernel_the_registry_gives_an_example(hc):
    from kernel_checks import with_examples

    order = hc.order()
    assert {c.kernel for c in order if isinstance(c, hc.Case)} >= set(with_examples())
    # those no prepared case covers come last, at their examples, in their dtypes
    (case,) = [c for c in order if getattr(c, "kernel", None) == "attention_mgpu_bwd"]
    assert case.dtypes == ("float16",) * 4 + ("float32", "float16")
    assert order.index(case) >= len(hc.PREPARED) and order[: len(hc.PREPARED)] == hc.PREPARED
    # a Mosaic GPU kernel known from its registration only runs on a GPU (jax 0.10.2's GPU
    # interpret mode cannot run JAX's attention); a prepared one is simulated on a CPU too
    assert hc.runs_on(case, "gpu") and not hc.runs_on(case, "cpu")
    (mgpu,) = [c for c in hc.CASES if c.kernel == "matmul_mgpu"]
    assert hc.runs_on(mgpu, "cpu") and not hc.runs_on(mgpu, "tpu")


@pytest.mark.slow
def test_the_smoke_run_ends_within_its_budget_lists_what_it_dropped_and_ships_its_table(
    hc, tmp_path, subprocess_env, monkeypatch
):
    budget = 30.0
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--budget-s", str(budget), "--out", str(tmp_path)],
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=5 * budget,
    )
    (report,) = tmp_path.glob("*.json")
    text = (tmp_path / f"{report.stem}.md").read_text()
    # The budget is the script's own clock, from its main() to its report (as its report says):
    # the interpreter's start and jax's import before it, which a loaded host stretches to
    # several seconds, are not the run's to plan. It stops each step by budget * OVERRUN less
    # the report's time; +3 s: the last step's stopping and the report's writing on a busy host
    own = float(re.search(r"; (\d+) s of a 30 s budget\.", text)[1])
    assert own <= budget * hc.OVERRUN + 3.0, proc.stdout[-3000:]

    def no_nan(text):  # JSON's NaN would be a time that is not one
        raise AssertionError(f"{text} in the report")

    doc = json.loads(report.read_text(), parse_constant=no_nan)
    assert text.startswith("# Hardware check: cpu")
    # every case is listed, in order of value, the first one run (those a CPU cannot run first,
    # each said so)
    skipped = [r for r in doc["cases"] if r["outcome"] == hc.GPU_ONLY]
    rows = doc["cases"][len(skipped) :]
    _shipped_only(monkeypatch)  # planned here as the script's own process plans
    on_cpu = [i for i in hc.order() if hc.runs_on(i, "cpu")]
    planned = hc.steps(on_cpu, hc.every_dtype(), True, hc.overheads_of("cpu"))
    assert [r["case"] for r in rows] == [s.label for s in planned]
    assert rows[0]["case"] == "matmul bfloat16"
    first = rows[0]
    assert first["outcome"] == "done", proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [(c["dtype"], c["ok"]) for c in first["correctness"]] == [("bfloat16", True)]
    # its tune ran and stored a verified entry; on a host so loaded that the tune's process
    # outlived the step's share, or the step had no time left for one, the tune says so and
    # the side by side still times the default: that is what keeps the run within budget
    budget_cut = first["rc"] is None and first["tune_output"][-1].startswith(
        ("stopped after", "skipped: no time left")
    )
    assert (first["rc"] == 0 and first["tuned_ok"]) or budget_cut, first["tune_output"]
    assert first["timer"] == "wall"
    timed = ("default", "vendor") if budget_cut else ("default", "tuned", "vendor")
    assert all(first[f"{n}_s"] > 0 and math.isfinite(first[f"{n}_s"]) for n in timed)
    # what ran finished and the rest was dropped for budget: how many ran depends on the host's
    # speed (the plan is made again from the time left before each step), never all of them.
    # On a loaded host a later case can overrun its plan: it is stopped at its limit (what keeps
    # the run within budget, checked above) and the run exits 1, as it would on a device.
    dropped = [r["case"] for r in rows if r["outcome"] == "not run: budget"]
    stopped = [r for r in rows[1:] if r["outcome"].startswith("timeout after")]
    assert all(r["wall_s"] <= r["limit_s"] + 2.0 for r in stopped), proc.stdout[-3000:]
    assert all(r["outcome"] in ("done", "not run: budget") or r in stopped for r in rows), (
        proc.stdout[-3000:]
    )
    assert dropped, proc.stdout[-3000:]
    assert f"- {dropped[0]}: not run: budget" in text
    assert proc.returncode == (1 if stopped else 0), proc.stdout[-3000:]
    # what it tuned is exported beside the report, in the layout a kernel's tuned= reads: a copy
    # of that layout serves it to the shipped matmul (tests: CPU; the check: its device kind)
    (table,) = (tmp_path / "tuned").glob("*.json")
    assert table.stem == report.stem and "Tuned entries exported (tuned/" in text
    tuned = next(e for e in json.loads(table.read_text())["entries"] if e["kernel"] == "matmul")
    layout = tmp_path / "copy" / "tuned"
    layout.mkdir(parents=True)
    shutil.copy(table, layout)
    from autotune.kernels import matmul
    from autotune.signature import parse_args

    monkeypatch.setattr(matmul, "spec", dataclasses.replace(matmul.spec, tuned=layout))
    autotune.configure()  # the lookups made before are forgotten
    x, y = (jnp.ones(a.shape, a.dtype) for a in parse_args(tuned["signature"]))
    got = matmul.explain(x, y)
    assert (got["source"], got["config"]) == ("shipped", tuned["config"])


def test_a_case_past_its_timeout_is_stopped_and_says_where_it_was(hc, tmp_path):
    step = hc.Step(hc.CASES[0], ("float32",), True)
    job = hc.job(step, 5.0, str(tmp_path / "check.db"), smoke=True, info={"platform": "cpu"})
    start = time.perf_counter()
    result = hc.run_step(job, 1.0, tmp_path)  # less than its process needs to start
    assert time.perf_counter() - start < 5.0
    assert result["outcome"].startswith("timeout after 1 s (during ")
    assert "default_s" not in result


@pytest.mark.slow
def test_a_backward_case_tunes_dq_and_times_it_against_the_vjp_of_xlas_attention(hc, tmp_path):
    # lse and delta float32 beside bf16 q, k, v, dO: correctness, `autotune tune` and the side
    # by side, on this CPU in interpret mode
    (case,) = [c for c in hc.CASES if c.kernel == "flash_attention_dq"]
    step = hc.Step(case, ("bfloat16",), True)
    job = hc.job(step, 3.0, str(tmp_path / "check.db"), smoke=True, info={"platform": "cpu"})
    job["tune_timeout_s"] = 120.0  # a busy host: what is tested here is not the plan's timing
    result = hc.run_step(job, 240.0, tmp_path)
    assert result["outcome"] == "done", result
    assert [(c["dtype"], c["ok"]) for c in result["correctness"]] == [("bfloat16", True)]
    assert result["rc"] == 0 and result["tuned_ok"], result.get("tune_output")
    assert result["vendor"].startswith("the VJP of jax.nn.dot_product_attention") and (
        result["vendor"].endswith("(xla)")
    )
    assert result["default_s"] > 0 and result["vendor_s"] > 0


def test_the_vendors_backward_is_timed_from_its_forwards_residuals_without_the_forward():
    # what the side by side times for cuDNN's (here XLA's) backward: the VJP alone, the
    # forward run once before; its dq, dk and dv are the whole VJP's
    import jax

    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import hardware_case
    finally:
        sys.path.remove(str(SCRIPT.parent))
    shapes = [[1, 2, 64, 16]] * 4 + [[1, 2, 64]] * 2
    args = hardware_case.inputs("flash_attention_dq", shapes, "float32")
    op, to_native = hardware_case.attention_ops(True, "xla", "highest", backward=True)
    native = to_native(args)
    # the backward's four products (dv, dp, dq, dk), not the forward's two besides
    assert str(jax.make_jaxpr(op)(*native)).count("dot_general") == 4
    forward, fwd_native = hardware_case.attention_ops(True, "xla", "highest", backward=False)
    q, k, v = fwd_native(args)
    do = native[-1]
    want = jax.vjp(forward, q, k, v)[1](do)
    got = jax.jit(op)(*native)
    for g, w in zip(got, want):
        assert jnp.allclose(g, w, atol=1e-5)
