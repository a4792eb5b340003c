"""A tuning run never reports success for work it lost, and never measures a configuration
twice: databases deleted or replaced mid-run, concurrent runs on one SQLite file, studies files
that are corrupt, workers killed mid-study. Real files, real processes, real signals."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jax.numpy as jnp
import pytest
import toy_kernels
from toy_kernels import make_input, scale

import autotune
from autotune import TuningDB
from autotune.cli import main
from autotune.errors import DatabaseError
from autotune.search import studies

TESTS = Path(__file__).parent


def tune_then(db, n_trials, after_trial, action):
    """Tune `scale` in this process; `action` runs once trial `after_trial` is stored."""

    def progress(record, i, n):
        if i == after_trial:
            action()

    x = make_input(rows=96)
    return autotune.tune(
        scale, [x], n_trials=n_trials, db=db, strategy="grid", finalists=0, progress=progress
    )


def test_a_deleted_database_stops_the_run_and_says_what_was_not_saved(tmp_path):
    db = tmp_path / "t.db"
    with pytest.raises(DatabaseError, match="deleted or replaced") as e:
        tune_then(str(db), 4, 2, lambda: os.remove(db))
    assert "scale f32[96,128]" in str(e.value) and "not saved" in str(e.value)


def test_a_database_moved_over_the_path_is_left_intact(tmp_path):
    db, other = tmp_path / "t.db", tmp_path / "other.db"
    tune_then(str(other), 2, 0, lambda: None)
    with TuningDB(other) as o:
        before = (o.query(), o.trials())
    with pytest.raises(DatabaseError, match="deleted or replaced"):
        tune_then(str(db), 4, 2, lambda: shutil.move(other, db))
    with TuningDB(db) as replaced:
        assert (replaced.query(), replaced.trials()) == before


@pytest.mark.parametrize("replace", ["deleted", "moved over"])
def test_a_rerun_after_the_database_was_replaced_tunes_afresh(tmp_path, cli, replace):
    # the study beside the database outlives it: its trials, stored in the database that was
    # deleted (or in another one, moved over the path), are not resumed into the new one
    db, other = tmp_path / "t.db", tmp_path / "other.db"
    if replace == "moved over":
        autotune.tune(scale, [make_input(rows=48)], n_trials=2, db=str(other), finalists=0)
    action = (lambda: os.remove(db)) if replace == "deleted" else lambda: shutil.move(other, db)
    storage = studies.default_storage(str(db))
    with pytest.raises(DatabaseError, match="deleted or replaced"):
        autotune.tune(
            scale,
            [make_input(rows=96)],
            n_trials=5,
            db=str(db),
            strategy="grid",
            finalists=0,
            storage=storage,
            progress=lambda r, i, n: action() if i == 2 else None,
        )
    proc = cli(tune_command(db, 96)[3:])  # the command's arguments, in this process
    assert "resuming" not in proc.stdout
    with TuningDB(db) as handle:
        entry = handle.best(next(e.key for e in handle.query() if e.key.signature == "f32[96,128]"))
        trials = handle.trials(signature="f32[96,128]")
    assert entry.n_trials == 5 and len(trials) == 5
    best = next(t for t in trials if t.db_id == entry.trial_id)
    assert best.config == entry.config
    assert main(["db", "check", "--db", str(db)]) == 0


def tune_command(db, rows, *extra):
    return [
        sys.executable,
        "-m",
        "autotune.cli",
        "tune",
        "toy_kernels:scale",
        "--shape",
        f"{rows}x128",
        "--trials",
        "5",
        "--strategy",
        "grid",
        "--finalists",
        "0",
        "--no-isolate",
        "--db",
        str(db),
        *extra,
    ]


def start(cmd, env):
    return subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=TESTS
    )


@pytest.mark.slow
def test_concurrent_tunes_on_one_sqlite_file_never_crash_nor_exceed_the_budget(
    tmp_path, subprocess_env
):
    # 8 processes a round on one SQLite file: 4 tune one key (one shared study, more workers
    # than its budget has trials to hand out), 2 a second key, 2 a third. The first round names
    # the studies file, which keeps its studies: each key's study spends its budget exactly,
    # no configuration measured twice. The second uses the default one beside the database,
    # whose study the last worker out deletes, so that workers create, join and delete one
    # study at the same moments (a run that starts after the deletion tunes afresh, as it
    # should): none crashes, none goes over its budget. (A third round only repeated the
    # second, for more chances at the same races.)
    for round in range(2):
        db = tmp_path / f"t{round}.db"
        named = ["--storage", f"sqlite:///{tmp_path}/studies.db"] if round == 0 else []
        procs = [
            start(tune_command(db, rows, "--trials", "3", *named), subprocess_env)
            for rows in (96,) * 4 + (48,) * 2 + (24,) * 2
        ]
        for proc in procs:
            out, err = proc.communicate(timeout=600)
            assert proc.returncode == 0 and "Traceback" not in err, err[-3000:]
            assert int(re.search(r"trials (\d+)", out)[1]) <= 3, out
        with TuningDB(db) as handle:
            trials = handle.trials()
            assert {e.key.signature for e in handle.query()} == {
                f"f32[{rows},128]" for rows in (96, 48, 24)
            }
        if named:
            measured = Counter((t.key.signature, t.config["block_rows"]) for t in trials)
            assert [k for k, n in measured.items() if n > 1] == []
            assert Counter(signature for signature, _ in measured) == {
                f"f32[{rows},128]": 3 for rows in (96, 48, 24)
            }


@pytest.mark.slow
def test_kills_right_after_trial_lines_never_measure_past_the_budget_nor_twice(
    tmp_path, subprocess_env
):
    # 6 kills (kill -9), each the moment a trial line is read: the trial is stored and printed,
    # and its study may not have heard of it yet. Two keys, each killed 3 times then run to the
    # end, side by side on one database.
    db = tmp_path / "t.db"
    env = {**subprocess_env, "PYTHONUNBUFFERED": "1"}

    def killed_then_finished(rows):
        cmd = tune_command(db, rows, "--trials", "5")
        cmd[cmd.index("toy_kernels:scale")] = "toy_kernels:gathered_scale"
        kills = 0
        while kills < 3:
            proc = start(cmd, env)
            line = next((ln for ln in proc.stdout if ln.startswith("trial")), None)
            if line is None:  # the budget was spent before this run's first trial: it finished
                break
            proc.kill()
            kills += proc.wait() == -signal.SIGKILL
            proc.stdout.close()
            proc.stderr.close()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=TESTS)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return kills, int(re.search(r"trials (\d+)", proc.stdout)[1])

    with ThreadPoolExecutor(2) as pool:
        outcomes = dict(zip((96, 192), pool.map(killed_then_finished, (96, 192))))
    assert sum(kills for kills, _ in outcomes.values()) == 6
    with TuningDB(db) as handle:
        for rows, (_, summary) in outcomes.items():
            trials = handle.trials(signature=f"f32[{rows},128]")
            measured = Counter(t.config["block_rows"] for t in trials if t.status != "duplicate")
            assert sum(measured.values()) == summary == 5, (rows, measured)
            assert max(measured.values()) == 1, (rows, measured)  # none measured twice
            (entry,) = handle.query(signature=f"f32[{rows},128]")
            assert entry.n_trials == 5


def test_a_study_deleted_between_opening_and_joining_it_is_joined_afresh(tmp_path):
    storage = f"sqlite:///{tmp_path}/studies.db"
    worker = studies.SharedStudy(storage, "k", None)  # opened, not yet joined ...
    studies.delete_study(storage, "k", unless_in_use=True)  # ... when the last one out leaves
    worker.join()
    # joined, the study is deleted by no other worker
    studies.delete_study(storage, "k", unless_in_use=True)
    assert worker.study.user_attrs == {f"worker {worker.worker}": True}


@pytest.mark.parametrize("strategy", ["random", "grid"])
def test_a_kill_during_the_first_trial_leaves_the_rerun_to_the_budget(
    tmp_path, subprocess_env, cli, strategy
):
    db = tmp_path / "t.db"
    # 3 of the 5 valid configurations: the default (and warm starts) queued, the rest proposed
    # (random) or queued behind it (grid)
    argv = tune_command(db, 96, "--trials", "3", "--strategy", strategy)
    argv[argv.index("toy_kernels:scale")] = "toy_kernels:interrupt_scale"
    killed = dict(subprocess_env, TOY_KILL_AT_TRACE="2")  # the oracle's trace, then the default's
    proc = subprocess.run(argv, env=killed, capture_output=True, text=True, cwd=TESTS)
    assert proc.returncode == -9, proc.stderr
    cli(argv[3:])  # the rerun, in this process: the kill, not the rerun, needs a process
    with TuningDB(db) as handle:
        (entry,) = handle.query()
        trials = handle.trials()
    # the default, which the kill left half measured, is measured first, within the budget
    assert entry.n_trials == len(trials) == 3
    assert trials[0].config == {"block_rows": 8} and trials[0].is_default


def test_an_interrupted_shared_run_counts_what_it_stored_and_the_rerun_keeps_the_budget(tmp_path):
    db, studies = str(tmp_path / "t.db"), f"sqlite:///{tmp_path}/studies.db"
    x = make_input(rows=96)

    def interrupt(record, i, n):
        if i == 2:
            raise KeyboardInterrupt  # as a Ctrl-C while the progress line is printed

    settings = dict(n_trials=4, db=db, strategy="grid", finalists=0, storage=studies)
    with pytest.raises(KeyboardInterrupt):
        autotune.tune(scale, [x], progress=interrupt, **settings)
    result = autotune.tune(scale, [x], **settings)  # this process's claim was released
    assert result.resumed == 2 and len(result.trials) == 4
    with TuningDB(db) as handle:
        stored = [t.config["block_rows"] for t in handle.trials()]
    assert len(stored) == len(set(stored)) == 4  # exactly the budget, none measured twice


def test_a_run_interrupted_between_storing_a_trial_and_telling_its_study_never_overruns(
    tmp_path, monkeypatch
):
    # A signal landing just after a trial's row is stored, before the search hears of it (the
    # SIGTERM redelivered after a gc callback of the CLI's interrupt test lands in that
    # bookkeeping): the interrupted run tells its study "not measured" and releases its claim.
    # The rerun, asked for what was left of the budget, must count that stored row, not measure
    # a budget's worth besides it.
    db, studies = str(tmp_path / "t.db"), f"sqlite:///{tmp_path}/studies.db"
    x, y = jnp.ones((64, 128)), jnp.ones((128, 64))  # 27 distinct programs
    settings = dict(n_trials=4, db=db, strategy="random", seed=0, finalists=0, storage=studies)
    add_trials, stored = TuningDB.add_trials, []

    def interrupted_once_stored(self, key, run_id, trials):
        ids = add_trials(self, key, run_id, trials)
        stored.append(ids)
        if len(stored) == 2:
            raise KeyboardInterrupt
        return ids

    monkeypatch.setattr(TuningDB, "add_trials", interrupted_once_stored)
    with pytest.raises(KeyboardInterrupt):
        autotune.tune("matmul", [x, y], **settings)
    monkeypatch.undo()
    # seeded otherwise, the rerun's sampler does not propose the interrupted trial's config again
    result = autotune.tune("matmul", [x, y], **{**settings, "seed": 1})
    with TuningDB(db) as handle:
        rows = [t for t in handle.trials() if t.status != "duplicate"]
        (entry,) = handle.query()
    configs = [json.dumps(t.config, sort_keys=True) for t in rows]
    assert len(configs) == len(set(configs)) == 4, configs  # the budget, none twice
    assert entry.n_trials == 4 and len([t for t in result.trials if t.status != "duplicate"]) == 4


def test_a_run_interrupted_while_the_default_is_measured_measures_it_on_resume(
    tmp_path, monkeypatch
):
    db, studies = str(tmp_path / "t.db"), f"sqlite:///{tmp_path}/studies.db"
    x = make_input(rows=96)
    settings = dict(n_trials=3, db=db, strategy="grid", finalists=2, storage=studies, seed=0)
    # traces counted from this test's first (other tests of this process traced it too): the
    # oracle's is the first, the measurement's next
    monkeypatch.setattr(toy_kernels, "_DEFAULT_TRACES", [0])
    monkeypatch.setattr(toy_kernels, "INTERRUPT_TRACES", {2})
    with pytest.raises(KeyboardInterrupt):
        autotune.tune(toy_kernels.interrupt_scale, [x], **settings)
    result = autotune.tune(toy_kernels.interrupt_scale, [x], **settings)
    default = [t for t in result.trials if t.config == {"block_rows": 8}]
    assert len(default) == 1 and default[0].status == "ok" and result.default_time_s
    assert {"block_rows": 8} in [f.config for f in result.finalists]
    assert not result.first_pass


def test_a_worker_killed_during_the_finalists_leaves_first_pass_figures_said_so(
    tmp_path, db_url, monkeypatch
):
    marker = tmp_path / "doomed"
    monkeypatch.setenv("TOY_DOOMED_MARKER", str(marker))  # the worker child inherits it

    def doom_after_the_search(record, i, n):
        if i == n:
            marker.touch()  # from now on the worker aborts when it runs the kernel

    result = autotune.tune(
        "toy_kernels:doomed_scale",
        [make_input(rows=32)],
        n_trials=3,
        db=db_url,
        strategy="grid",
        isolate=True,
        progress=doom_after_the_search,
    )
    assert result.first_pass and len(result.finalists) == 3
    assert "first-pass figures" in result.summary


def test_a_corrupt_studies_file_is_set_aside_with_a_warning(tmp_path, caplog):
    studies = tmp_path / "t-studies.db"
    garbage = os.urandom(8192)
    studies.write_bytes(garbage)
    with caplog.at_level(logging.WARNING, logger="autotune.search.studies"):
        result = autotune.tune(
            scale,
            [make_input(rows=32)],
            n_trials=2,
            db=str(tmp_path / "t.db"),
            finalists=0,
            storage=f"sqlite:///{studies}",
        )
    assert len(result.trials) == 2
    (aside,) = tmp_path.glob("t-studies.db.corrupt-*")
    assert aside.read_bytes() == garbage  # kept for inspection
    assert any("set aside" in r.getMessage() for r in caplog.records)
    assert stat.S_IMODE(studies.stat().st_mode) == 0o600  # the new one as private as the first


def test_a_resumed_cli_run_says_so_before_its_trials_and_optuna_stays_quiet(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(TESTS)
    db = tmp_path / "t.db"
    studies = f"sqlite:///{tmp_path}/studies.db"
    with pytest.raises(KeyboardInterrupt):  # an earlier run, interrupted after two trials
        autotune.tune(
            scale,
            [make_input(rows=96)],
            n_trials=3,
            db=str(db),
            strategy="grid",
            finalists=0,
            storage=studies,
            progress=lambda r, i, n: (_ for _ in ()).throw(KeyboardInterrupt) if i == 2 else None,
        )
    capsys.readouterr()
    argv = tune_command(db, 96, "--storage", studies, "--trials", "3")[3:]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0] == "resuming: 2 of 3 trials already measured by an earlier run"
    assert lines[1].startswith("trial   3/3")
    assert "A new study created" not in err
