"""Nothing is lost: many writer processes on one database, and tuning processes killed with
SIGKILL at random points."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from autotune.db import TuningDB

ROOT = Path(__file__).parent.parent
# 4 writers: two suffice for each race here (creating the schema, upserting rows, incrementing
# one shared counter), and 4 make it likely at every step; 100 rows each keep them writing
# while the others start, so that they write at the same moments
N_PROCS, N_ROWS = 4, 100

WRITER = textwrap.dedent(
    """
    import sys
    from autotune.db import TuningDB
    from autotune.signature import TuningKey
    from autotune.trial import BestEntry
    url, p, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    db = TuningDB(url)
    shared = TuningKey("shared", "v1", "cpu", "cpu", "interpret", "f32[1]")
    for i in range(n):
        key = TuningKey("conc", "v1", "cpu", "cpu", "interpret", f"f32[{p},{i}]")
        db.put_best(key, BestEntry({"p": p, "i": i}, 1e-3, 1, run_id=f"p{p}", strategy="grid"))
        db.record_miss(key)
        db.record_miss(shared)
    print("done")
    """
)


def env():
    e = dict(os.environ, JAX_PLATFORMS="cpu")
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests")])
    return e


def run_writers(url):
    # no schema yet: the children also race to create it
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, url, str(p), str(N_ROWS)],
            env=env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for p in range(N_PROCS)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0 and out.strip() == "done" and not err.strip(), err[-2000:]
    with TuningDB(url) as db:
        results = db.query(kernel="conc")
        misses = {m["signature"]: m["count"] for m in db.misses()}
    assert sorted((r.config["p"], r.config["i"]) for r in results) == [
        (p, i) for p in range(N_PROCS) for i in range(N_ROWS)
    ]
    assert all(r.key.signature == f"f32[{r.config['p']},{r.config['i']}]" for r in results)
    assert misses.pop("f32[1]") == N_PROCS * N_ROWS  # no increment lost
    assert len(misses) == N_PROCS * N_ROWS and set(misses.values()) == {1}


def test_concurrent_writers_on_one_sqlite_file(tmp_path):
    run_writers(str(tmp_path / "shared.db"))


# Rounds of 8 processes that open one new SQLite file at the same moment, each switching it to
# WAL as every connection does (dbconnect.sqlite_pragmas). SQLite answers the loser of such a
# race "database is locked" without waiting; without the retry, about 1 round in 9 had a loser
# here, so 40 rounds pass by chance with a chance of about 1 in 100.
WAL_RACE = textwrap.dedent(
    """
    import multiprocessing, os, sqlite3, sys, time
    from autotune.sql import sqlite_pragmas

    def open_at(path, start, errors):
        conn = sqlite3.connect(path)
        time.sleep(max(0.0, start - time.time()))
        try:
            sqlite_pragmas(10.0, read_only=False)(conn, None)
        except sqlite3.Error as e:
            errors.put(str(e))

    folder, rounds = sys.argv[1], int(sys.argv[2])
    fork = multiprocessing.get_context("fork")
    errors = fork.Queue()
    for r in range(rounds):
        path = os.path.join(folder, f"race{r}.db")
        open(path, "w").close()
        start = time.time() + 0.2
        procs = [fork.Process(target=open_at, args=(path, start, errors)) for _ in range(8)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        assert all(p.exitcode == 0 for p in procs)
    lost = []
    while not errors.empty():
        lost.append(errors.get())
    print(len(lost), lost[:1])
    """
)


def test_processes_that_open_a_new_sqlite_file_together_all_switch_it_to_wal(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", WAL_RACE, str(tmp_path), "40"],
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "0 []", out.stdout


@pytest.mark.postgres
def test_concurrent_writers_on_one_postgres_database(pg_url):
    run_writers(pg_url)


# --------------------------------------------------------------------------- crash safety

STORER = textwrap.dedent(
    """
    import sys
    from autotune.db import TuningDB
    from autotune.signature import TuningKey
    from autotune.trial import BestEntry, TrialRecord
    db = TuningDB(sys.argv[1])
    i = 0
    print("ready", flush=True)
    while True:  # what tuner._store does, as fast as it can, until killed
        key = TuningKey("crash", "v1", "cpu", "cpu", "interpret", f"f32[{i % 50}]")
        trials = [TrialRecord({"b": b}, "ok", time_s=1.0 / (b + i)) for b in range(1, 9)]
        ids = db.add_trials(key, f"run{i}", trials)  # trials first, as measured
        db.put_best(key, BestEntry({"b": i % 8 + 1}, 1e-3, 8, run_id=f"run{i}", strategy="grid",
                                   trial_id=ids[i % 8]))
        i += 1
    """
)

TUNER = textwrap.dedent(
    """
    import itertools, sys, autotune
    from toy_kernels import make_input, scale
    autotune.TuningDB(sys.argv[1]).close()  # the schema exists before any kill, however slow
    print("ready", flush=True)
    for rows in itertools.cycle((8, 16, 24, 32, 48, 64, 96)):
        autotune.tune(scale, [make_input(rows=rows)], n_trials=2, strategy="random")
    """
)


def kill_at_random(script, path, rounds, window, rng):
    for _ in range(rounds):
        proc = subprocess.Popen(
            [sys.executable, "-c", script, str(path)],
            env=dict(env(), PALLAS_AUTOTUNE_DB=str(path)),
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(*window))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert proc.returncode == -signal.SIGKILL


def assert_consistent(path):
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    key = "kernel, kernel_version, platform, device_kind, backend, signature, static"
    results = conn.execute(f"SELECT id, trial_id, config, {key} FROM autotune_results").fetchall()
    for rid, trial_id, config, *rkey in results:
        trial = conn.execute(
            f"SELECT status, config, {key} FROM autotune_trials WHERE id = ?", (trial_id,)
        ).fetchone()
        assert trial is not None, f"best entry {rid} points at missing trial {trial_id}"
        status, tconfig, *tkey = trial
        assert status == "ok" and tconfig == config and tkey == rkey
    conn.close()
    return len(results)


def test_sigkill_during_stores_never_leaves_a_dangling_best(tmp_path):
    path = tmp_path / "crash.db"
    kill_at_random(STORER, path, rounds=8, window=(0.05, 0.6), rng=random.Random(7))
    assert assert_consistent(path) > 0


@pytest.mark.slow
def test_sigkill_during_real_tuning_runs(tmp_path):
    path = tmp_path / "crash.db"
    kill_at_random(TUNER, path, rounds=3, window=(1.0, 5.0), rng=random.Random(11))
    assert_consistent(path)
    with TuningDB(path) as db:  # and the survivors are served as usual
        assert all(r.config["block_rows"] in (8, 12, 16, 24, 32) for r in db.query())
