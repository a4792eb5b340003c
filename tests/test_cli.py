"""The `autotune` command on a real SQLite file: in this process (tests/conftest.py `cli`), and in a
real subprocess where a kill is the subject."""

import json
import subprocess
import sys

import pytest

from autotune import TuningDB


def test_tune_then_list_and_trials(cli, db_url):
    # measured in this process: the device worker is not the subject (see the crash test below)
    tune = ["tune", "matmul", "--shape", "32x64,64x32", "--trials", "3", "--seed", "0"]
    out = cli([*tune, "--no-isolate"]).stdout
    assert out.count("trial ") == 3
    assert "best " in out and "speedup" in out and "rejected 0" in out
    rows = json.loads(cli(["db", "list", "--format", "json"]).stdout)
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
    trials = json.loads(cli(["db", "trials", "--kernel", "matmul", "--format", "json"]).stdout)
    assert len(trials) == 3 and {t["status"] for t in trials} == {"ok"}
    # the compiler's memory analysis of each measured program (CPU reports it)
    assert all(t["memory_peak_bytes"] >= t["memory_argument_bytes"] > 0 for t in trials)
    assert "peak_memory" in cli(["db", "trials"]).stdout
    csv_out = cli(["db", "trials", "--format", "csv"]).stdout.splitlines()
    assert len(csv_out) == 4 and csv_out[0].startswith("id,")
    table = cli(["db", "list", "--kernel", "matmul"]).stdout
    assert "f32[32,64],f32[64,32]" in table
    assert cli(["db", "list", "--kernel", "nothing"]).stdout.strip() == "(no rows)"


def test_tune_measures_each_distinct_program_once(cli):
    # block_rows 16 to 128 are clamped to the 16 rows: one program; 8 is another
    tune = ["tune", "softmax", "--shape", "16x128", "--trials", "5", "--strategy", "grid"]
    out = cli([*tune, "--no-isolate"]).stdout
    assert "trials 2 (+3 duplicates)" in out, out
    assert "the 5 valid configurations compile to 2 distinct programs, every one measured" in out
    trials = json.loads(cli(["db", "trials", "--format", "json"]).stdout)
    measured = {t["id"]: t for t in trials if t["status"] == "ok"}
    duplicates = [t for t in trials if t["status"] == "duplicate"]
    assert len(measured) == 2 and len(duplicates) == 3
    assert {t["config"]["block_rows"] for t in duplicates} == {16, 32, 128}
    for t in duplicates:  # named after the trial that measured the default's program
        of = measured[t["duplicate_of"]]
        assert of["config"] == {"block_rows": 64} and t["fingerprint"] == of["fingerprint"]
        assert t["time_s"] is None


def test_kernels_lists_shipped_kernels_with_parameters(cli):
    out = cli(["kernels"]).stdout
    assert "matmul" in out and "block_m in [16, 32, 64, 128]" in out and "vector_add" in out


def test_import_path_kernel(cli):
    tune = ["tune", "toy_kernels:scale", "--shape", "16x128", "--trials", "2"]
    out = cli([*tune, "--no-isolate"]).stdout
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
def test_user_errors_are_one_line_with_exit_code_2(cli, db_url, args, message):
    proc = cli(args, rc=2)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autotune: error: ") and message in lines[0], (
        proc.stderr
    )
    assert proc.stdout == ""
    assert TuningDB(db_url).query() == [] and TuningDB(db_url).trials() == []


def test_check_reports_every_tpu_candidate(cli):
    out = cli(["check", "vector_add", "--platform", "tpu", "--shape", "5000,5000"])
    assert "7 candidates, 7 accepted by the constraints, 0 of those do not lower" in out.stdout
    assert out.stdout.count(" yes") == 7
    bad = cli(["check", "vector_add", "--shape", "5000"], rc=2)
    assert "vector_add takes 2 array argument(s) (x, y)" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_tune_isolates_by_default_and_records_a_crash(cli):
    args = ["tune", "toy_kernels:fragile_scale", "--shape", "16x128", "--strategy", "grid"]
    out = cli([*args, "--trials", "2", "--compile-timeout", "20"]).stdout
    assert "crashed" in out and "crashed/timeout 1" in out and "block_rows=8" in out
    trials = json.loads(cli(["db", "trials", "--format", "json"]).stdout)
    assert sorted(t["status"] for t in trials) == ["crashed", "ok"]
    bad = cli([*args, "--run-timeout", "0"], rc=2)
    assert "--run-timeout must be a positive number of seconds" in bad.stderr
    bad = cli([*args, "--compile-workers", "-1"], rc=2)
    assert "--compile-workers must be 0 or more, got -1" in bad.stderr


@pytest.mark.slow
def test_plain_tune_killed_mid_run_resumes_and_a_finished_one_starts_afresh(
    subprocess_env, db_url, cli
):
    import os
    import signal

    # 27 distinct programs (blocks clamp to the shape): the budget of 4 never outruns them.
    # Measured in the process that is killed (the device worker is not the subject here)
    cmd = ["tune", "matmul", "--shape", "64x128,128x64", "--trials", "4", "--seed", "0"]
    cmd += ["--no-isolate"]
    env = dict(subprocess_env, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "autotune.cli", *cmd], env=env, stdout=subprocess.PIPE, text=True
    )
    for line in proc.stdout:
        if "trial   2/4" in line:
            os.kill(proc.pid, signal.SIGKILL)
            break
    proc.wait(timeout=60)
    proc.stdout.close()

    # measured trials (large blocks clamp alike: those are duplicates, not measured)
    def measured():
        return [t for t in TuningDB(db_url).trials() if t.status != "duplicate"]

    def lines(out):
        return [ln for ln in out.splitlines() if "trial " in ln and "duplicate" not in ln]

    assert len(measured()) >= 2 and TuningDB(db_url).query() == []

    out = cli(cmd).stdout
    done = int(out.split("resumed: ")[1].split(" of 4 trials already measured")[0])
    assert done >= 1  # trial 2 was stored; the kill may land before its study heard of it
    assert len(lines(out)) == 4 - done
    assert len(measured()) <= 5  # at most the one in flight measured twice
    (entry,) = TuningDB(db_url).query()
    assert entry.n_trials == 4

    again = cli(cmd).stdout  # finished: its study is gone, this one is new
    assert "resumed" not in again and len(lines(again)) == 4


JUNK = bytes(range(128, 256)) * 4
VALID_JOB = '[[task]]\nkernel = "vector_add"\nshape = "256,256"\n'
BAD_INPUT = {
    "negative seed": (["tune", "matmul", "--shape", "32x32,32x32", "--seed", "-1"], "--seed must"),
    "seed above 2^32": (
        ["tune", "matmul", "--shape", "32x32,32x32", "--seed", str(2**32)],
        "--seed must",
    ),
    "run timeout nan": (
        ["tune", "matmul", "--shape", "32x32,32x32", "--run-timeout", "nan"],
        "--run-timeout must be a positive",
    ),
    "memory bound zero": (
        ["tune", "matmul", "--shape", "32x32,32x32", "--max-memory", "0"],
        "--max-memory must be a positive number of bytes",
    ),
    "time limit nan": (
        ["tune", "matmul", "--shape", "32x32,32x32", "--time-limit", "nan"],
        "--time-limit must be a positive",
    ),
    "binary job file": (["tune", "--job", "junk.bin"], "job file junk.bin is not text"),
    "binary import": (["db", "import", "junk.bin"], "junk.bin is not JSON"),
    "import of another JSON": (["db", "import", "other.json"], "not a pallas-autotune export"),
    "driver not installed": (["db", "list", "--db", "mysql://u@h/x"], "driver is not installed"),
    "storage not a URL": (
        ["tune", "--job", "job.toml", "--storage", "notaurl://x"],
        "--storage notaurl://x is not a database URL",
    ),
    "report into a file": (["report", "--out", "a_file"], "--out a_file is a file"),
    "report under a file": (["report", "--out", "a_file/sub"], "under a_file, which is a file"),
    "id beyond any database": (["db", "show", "1" + "0" * 25], "no entry with id"),
    "inputs beyond memory": (
        ["tune", "matmul", "--shape", "1048576x1048576,1048576x1048576"],
        "GiB, more than this machine can hold",
    ),
    "a dimension of 401 digits": (
        ["tune", "matmul", "--shape", f"1{'0' * 400}x64,64x64"],
        "bytes, more than this machine can hold",
    ),
    "--kernel without --pending": (
        ["tune", "matmul", "--shape", "64x64,64x64", "--kernel", "softmax"],
        "--kernel picks the kernel of --pending's misses: give it with --pending",
    ),
    "studies storage a folder": (
        ["tune", "matmul", "--shape", "64x64,64x64", "--storage", "a_dir"],
        "--storage a_dir is a folder: give a file in it",
    ),
    "studies storage in no folder": (
        ["tune", "matmul", "--shape", "64x64,64x64", "--storage", "nowhere/s.db"],
        "--storage nowhere/s.db: its folder",
    ),
    "float64 without x64": (
        ["tune", "matmul", "--shape", "64x64,64x64", "--dtype", "float64"],
        "JAX_ENABLE_X64=1",
    ),
    "check of zero dims": (["check", "matmul", "--shape", "0x0,0x0"], "zero dimension"),
    "a zero dimension": (
        ["tune", "matmul", "--shape", "0x64,64x64"],
        "argument 1 (0x64) has a zero dimension",
    ),
    "one shape for two arrays": (
        ["tune", "matmul", "--shape", "64x64"],
        "matmul takes 2 array argument(s) (x, y)",
    ),
    "unknown dtype filter": (["db", "list", "--dtype", "float23"], "unknown dtype 'float23'"),
    "misspelled kernel in task 2": (
        ["tune", "--job", "typo.toml"],
        "typo.toml, task 2: unknown kernel 'matmull'",
    ),
    "unknown default": (
        ["tune", "--job", "defaults.toml"],
        "defaults.toml, [defaults]: unknown field(s) bogus",
    ),
    "a precision the kernel does not take": (
        ["tune", "--job", "precision.toml"],
        "precision.toml, task 1: --static precision='bogus': matmul takes one of 'highest'",
    ),
}


@pytest.mark.parametrize("case", BAD_INPUT)
def test_bad_input_is_one_line_with_exit_2_and_writes_nothing(case, tmp_path, monkeypatch, capsys):
    from autotune.cli import main

    argv, words = BAD_INPUT[case]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PALLAS_AUTOTUNE_DB", str(tmp_path / "tuning.db"))
    (tmp_path / "junk.bin").write_bytes(JUNK)
    (tmp_path / "other.json").write_text('{"entries": []}')
    (tmp_path / "a_file").write_text("")
    (tmp_path / "a_dir").mkdir()
    (tmp_path / "job.toml").write_text(VALID_JOB)
    (tmp_path / "typo.toml").write_text(VALID_JOB + VALID_JOB.replace("vector_add", "matmull"))
    (tmp_path / "defaults.toml").write_text("[defaults]\nbogus = 1\n" + VALID_JOB)
    (tmp_path / "precision.toml").write_text(
        '[[task]]\nkernel = "matmul"\nshapes = ["64x64,64x64"]\nstatic = { precision = "bogus" }\n'
    )
    before = sorted(tmp_path.iterdir())
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("autotune: error: ") and err.count("\n") == 1, err
    assert words in err
    assert sorted(tmp_path.iterdir()) == before  # no database, no studies, no report


def test_a_time_limit_that_ends_before_any_trial_says_so(cli):
    proc = cli(
        ["tune", "vector_add", "--shape", "256,256", "--time-limit", "1e-9", "--no-isolate"], rc=2
    )
    assert "the time limit ran out before any candidate" in proc.stderr
    assert "--time-limit" in proc.stderr and "()" not in proc.stderr


def test_a_kernel_of_the_users_own_named_alone_is_told_how_to_import_it(capsys):
    from autotune.cli import main

    assert main(["tune", "scale_rows", "--shape", "512x256"]) == 2
    err = capsys.readouterr().err
    assert "unknown kernel 'scale_rows'" in err and "--import MODULE" in err
    assert "'module:scale_rows'" in err and len(err.splitlines()) == 1


def test_shapes_the_kernel_cannot_take_are_refused_before_anything_compiles(tmp_path, capsys):
    from autotune.cli import main

    db = tmp_path / "t.db"
    rc = main(["tune", "matmul", "--shape", "64x32,64x64", "--db", str(db)])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "matmul does not take --shape 64x32,64x64 (f32[64,32],f32[64,64])" in err
    assert "x.shape=(64, 32) and y.shape=(64, 64)" in err  # which dimensions disagree
    assert "interpret mode" not in err and not db.exists()  # no worker, no database
