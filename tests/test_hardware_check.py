"""The prepared accelerator check, in its smoke mode: the same code on this CPU, tiny shapes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_hardware_check_runs_every_case_end_to_end_in_smoke_mode(tmp_path, subprocess_env):
    script = ROOT / "benchmarks" / "hardware_check.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--smoke", "--out", str(tmp_path)],
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (report,) = tmp_path.glob("*.json")
    doc = json.loads(report.read_text())
    assert (tmp_path / f"{report.stem}.md").read_text().startswith("# Hardware check: cpu")

    sys.path.insert(0, str(script.parent))
    try:
        from hardware_check import AWKWARD, CASES, CHECKED_DTYPES
    finally:
        sys.path.remove(str(script.parent))
    checked = {(c["kernel"], c["dtype"]) for c in doc["correctness"] if c["ok"]}
    dtypes = {k: CHECKED_DTYPES.get(k, ("float32", "bfloat16")) for k in AWKWARD}
    assert checked == {(k, d) for k, ds in dtypes.items() for d in ds}
    tuned = [c.label for c in CASES if c.smoke_shapes is not None]
    assert [r["case"] for r in doc["cases"]] == tuned and "matmul_mgpu bfloat16" not in tuned
    for row in doc["cases"]:
        assert row["rc"] == 0 and row["tuned_ok"], row
        assert row["timer"] == "wall" and row["trial_timers"] == ["wall"]  # the CPU has no other
        assert all(row[f"{name}_s"] > 0 for name in ("default", "tuned", "vendor"))
        assert row["trials"] >= 1 and row["repeat_spread"] >= 0
