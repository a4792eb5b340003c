"""The `autotune` command in real subprocesses, on a real SQLite file."""

import json
import subprocess
import sys

import pytest

from autotune import TuningDB


def run(args, env, check_rc=0):
    proc = subprocess.run(
        [sys.executable, "-m", "autotune.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == check_rc, proc.stderr
    return proc


def test_tune_then_list_and_trials(subprocess_env, db_url):
    out = run(
        ["tune", "matmul", "--shape", "32x64,64x32", "--trials", "3", "--seed", "0"], subprocess_env
    ).stdout
    assert out.count("trial ") == 3
    assert "best " in out and "speedup" in out and "rejected 0" in out
    rows = json.loads(run(["db", "list", "--format", "json"], subprocess_env).stdout)
    (row,) = rows
    for field in (
        "kernel",
        "platform",
        "device_kind",
        "backend",
        "signature",
        "config",
        "time_s",
        "default_time_s",
        "speedup",
    ):
        assert field in row
    assert row["kernel"] == "matmul" and row["signature"] == "f32[32,64],f32[64,32]"
    trials = json.loads(
        run(["db", "trials", "--kernel", "matmul", "--format", "json"], subprocess_env).stdout
    )
    assert len(trials) == 3 and {t["status"] for t in trials} == {"ok"}
    csv_out = run(["db", "trials", "--format", "csv"], subprocess_env).stdout.splitlines()
    assert len(csv_out) == 4 and csv_out[0].startswith("id,")
    table = run(["db", "list", "--kernel", "matmul"], subprocess_env).stdout
    assert "f32[32,64],f32[64,32]" in table
    assert run(["db", "list", "--kernel", "nothing"], subprocess_env).stdout.strip() == "(no rows)"


def test_kernels_lists_shipped_kernels_with_parameters(subprocess_env):
    out = run(["kernels"], subprocess_env).stdout
    assert "matmul" in out and "block_m in [16, 32, 64, 128]" in out and "vector_add" in out


def test_import_path_kernel(subprocess_env):
    out = run(
        ["tune", "toy_kernels:scale", "--shape", "16x128", "--trials", "2"], subprocess_env
    ).stdout
    assert "scale f32[16,128]" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["tune", "nope", "--shape", "8x8"], "unknown kernel 'nope'"),
        (["tune", "matmul", "--shape", "8y8,8x8"], "malformed --shape"),
        (["tune", "matmul", "--shape", "8x8,8x8", "--dtype", "flaot32"], "unknown dtype 'flaot32'"),
        (
            ["tune", "matmul", "--shape", "8x8,8x8", "--dtype", "f32,f32,f32"],
            "--dtype gives 3 dtypes for 2 shapes",
        ),
        (["tune", "matmul"], "required: --shape"),
        (["tune", "matmul", "--shape", "8x8,8x8", "--trials", "0"], "--trials must be at least 1"),
        (
            ["tune", "toy_kernels:scale", "--shape", "7x128"],
            "no configuration of scale's cpu space",
        ),
        (["tune", "no_such_module:f", "--shape", "8"], "cannot import 'no_such_module'"),
        (["db", "list", "--format", "xml"], "invalid choice: 'xml'"),
    ],
)
def test_user_errors_are_one_line_with_exit_code_2(subprocess_env, db_url, args, message):
    proc = run(args, subprocess_env, check_rc=2)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autotune: error: ") and message in lines[0], (
        proc.stderr
    )
    assert proc.stdout == ""
    assert TuningDB(db_url).query() == [] and TuningDB(db_url).trials() == []


def test_check_reports_every_tpu_candidate(subprocess_env):
    out = run(["check", "vector_add", "--platform", "tpu", "--shape", "5000,5000"], subprocess_env)
    assert "7 candidates, 7 accepted by the constraints, 0 of those do not lower" in out.stdout
    assert out.stdout.count(" yes") == 7
    bad = run(["check", "vector_add", "--shape", "5000"], subprocess_env, check_rc=2)
    assert "missing a required argument: 'y'" in bad.stderr and "Traceback" not in bad.stderr


def test_tune_isolates_by_default_and_records_a_crash(subprocess_env):
    args = ["tune", "toy_kernels:fragile_scale", "--shape", "16x128", "--strategy", "grid"]
    out = run([*args, "--trials", "2", "--compile-timeout", "20"], subprocess_env).stdout
    assert "crashed" in out and "crashed/timeout 1" in out and "block_rows=8" in out
    trials = json.loads(run(["db", "trials", "--format", "json"], subprocess_env).stdout)
    assert sorted(t["status"] for t in trials) == ["crashed", "ok"]
    bad = run([*args, "--run-timeout", "0"], subprocess_env, check_rc=2)
    assert "--run-timeout must be positive" in bad.stderr
    bad = run([*args, "--compile-workers", "-1"], subprocess_env, check_rc=2)
    assert "--compile-workers must be 0 or more, got -1" in bad.stderr


@pytest.mark.slow
def test_plain_tune_killed_mid_run_resumes_and_a_finished_one_starts_afresh(subprocess_env, db_url):
    import os
    import signal

    cmd = ["tune", "matmul", "--shape", "32x64,64x32", "--trials", "6", "--seed", "0"]
    env = dict(subprocess_env, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "autotune.cli", *cmd], env=env, stdout=subprocess.PIPE, text=True
    )
    for line in proc.stdout:
        if "trial   3/6" in line:
            os.kill(proc.pid, signal.SIGKILL)
            break
    proc.wait(timeout=60)
    proc.stdout.close()
    stored = len(TuningDB(db_url).trials())
    assert stored >= 3 and TuningDB(db_url).query() == []

    out = run(cmd, subprocess_env).stdout
    done = int(out.split("resumed: ")[1].split(" of 6 trials already measured")[0])
    assert done >= 2  # trial 3 was stored; the kill may land before its study heard of it
    assert out.count("trial ") == 6 - done
    assert len(TuningDB(db_url).trials()) <= 7  # at most the one in flight measured twice
    (entry,) = TuningDB(db_url).query()
    assert entry["n_trials"] == 6

    again = run(cmd, subprocess_env).stdout  # finished: its study is gone, this one is new
    assert "resumed" not in again and again.count("trial ") == 6
