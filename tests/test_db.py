"""The tuning database across processes, on one real SQLite file."""

import os
import stat
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp

import autotune
from autotune import TuningDB
from autotune.kernels import vector_add
from autotune.search.studies import SharedStudy, default_storage
from autotune.signature import TuningKey


def test_round_trip_across_two_processes(subprocess_env, db_url):
    # tuned and stored here; served to a fresh process, which knows only the database
    x = jax.ShapeDtypeStruct((512,), jnp.float32)
    best = autotune.tune(vector_add, [x, x], n_trials=3, seed=0, db=db_url).best_config
    reader = textwrap.dedent(
        """
        import jax.numpy as jnp
        from autotune.kernels import vector_add
        x = jnp.ones(512, jnp.float32)
        info = vector_add.explain(x, x)
        assert float(vector_add(x, x)[0]) == 2.0
        print(info["source"], info["config"]["block"])
        """
    )
    read = subprocess.run(
        [sys.executable, "-c", reader],
        env=subprocess_env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert read.stdout.split() == ["db", str(best["block"])]
    # the budget counts distinct programs measured; blocks clamped to the same program are
    # stored beside them as duplicates
    trials = TuningDB(db_url).trials(kernel="vector_add")
    assert [t.status for t in trials].count("ok") == 3
    assert {t.status for t in trials} <= {"ok", "duplicate"}


def test_sqlite_runs_in_wal_mode(db_url):
    db = TuningDB(db_url)
    with db.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"


def test_default_database_is_private_to_the_user(tmp_path, monkeypatch):
    monkeypatch.delenv("PALLAS_AUTOTUNE_DB")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    db = TuningDB()
    path = tmp_path / "cache" / "pallas-autotune" / "tuning.db"
    assert db.url == f"sqlite:///{path}"
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_file_paths_are_taken_exactly(tmp_path):
    # a URL would read `?` as a query, `%69` as an escape and `#` as a fragment
    for name in ("a?b.db", "we%69rd.db", "c#d.db"):
        path = tmp_path / name
        with TuningDB(path) as db:
            db.record_miss(TuningKey("k", "1", "cpu", "cpu", "interpret", "f32[8]"))
        assert len(TuningDB(path).misses()) == 1
        SharedStudy(default_storage(str(path)), "s", sampler=None)
        assert (tmp_path / (path.stem + "-studies.db")).is_file()
    names = {p.name for p in tmp_path.iterdir()}
    assert {"a", "weird.db", "c"}.isdisjoint(names)
    assert {"a?b.db", "we%69rd.db", "c#d.db"} <= names


def test_a_jobs_studies_file_is_private_to_the_user(tmp_path):
    SharedStudy(default_storage(str(tmp_path / "tuning.db")), "s", sampler=None)
    assert stat.S_IMODE(os.stat(tmp_path / "tuning-studies.db").st_mode) == 0o600


def test_a_trials_device_fingerprint_and_memory_are_stored(tmp_path):
    from autotune.trial import TrialRecord

    key = TuningKey("k", "1", "cpu", "cpu", "interpret", "f32[8]")
    measured = TrialRecord(
        {"block": 8},
        "ok",
        time_s=1e-3,
        device="cpu:1",
        fingerprint="ab12",
        memory_argument_bytes=32,
        memory_output_bytes=32,
        memory_temp_bytes=0,
        memory_peak_bytes=2**40,  # past 32 bits: a BigInteger column
    )
    with TuningDB(tmp_path / "t.db") as db:
        [first] = db.add_trials(key, "run", [measured])
        db.add_trials(key, "run", [TrialRecord({"block": 16}, "duplicate", duplicate_of=first)])
        stored = db.trials(kernel="k")
    assert [t.status for t in stored] == ["ok", "duplicate"]
    assert stored[0].device == "cpu:1" and stored[0].fingerprint == "ab12"
    assert stored[0].memory_peak_bytes == 2**40 and stored[0].memory_temp_bytes == 0
    assert stored[1].duplicate_of == stored[0].db_id
