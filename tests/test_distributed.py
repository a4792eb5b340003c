"""Three tuning workers on one task, sharing one study on the real PostgreSQL server."""

import collections
import json
import subprocess
import sys
import time

import optuna
import pytest
import sqlalchemy

from autotune import TuningDB

pytestmark = [pytest.mark.postgres, pytest.mark.slow]
WORKERS = 3
# above the 6 distinct programs of matmul at 32x64,64x32 (its larger blocks clamp alike), so the
# workers store duplicates of each other's programs and end on a budget's worth of them in a
# row; each worker lowers that many configurations at least, so it is kept small, yet large
# enough that a worker starting late still finds some left to measure
BUDGET = 9


@pytest.fixture
def pg_storage_url(pg_url):
    """A second fresh database on the same server, for the Optuna studies."""
    server, name = pg_url.rsplit("/", 1)
    studies = f"{name}_studies"
    admin = sqlalchemy.create_engine(f"{server}/{name}", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{studies}"')
    yield f"{server}/{studies}"
    with admin.connect() as conn:
        conn.exec_driver_sql(
            f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{studies}'"
        )
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{studies}"')
    admin.dispose()


def test_three_workers_share_one_study_and_store_its_best_trial(
    subprocess_env, pg_url, pg_storage_url
):
    cmd = [
        sys.executable,
        "-m",
        "autotune.cli",
        "tune",
        "matmul",
        "--shape",
        "32x64,64x32",
        "--trials",
        str(BUDGET),
        "--db",
        pg_url,
        "--storage",
        pg_storage_url,
        # each worker would re-measure its finalists on its own device and store that figure;
        # without it, "the best entry is the best trial of the study" is exact
        "--finalists",
        "0",
        "--no-isolate",  # the workers share a study; a device worker each adds nothing to that
    ]
    workers = [
        subprocess.Popen(cmd, env=subprocess_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(WORKERS)
    ]
    for w in workers:
        out, err = w.communicate(timeout=600)
        assert w.returncode == 0, err.decode()

    with TuningDB(pg_url) as db:
        (entry,) = db.query(kernel="matmul")
        trials = db.trials(kernel="matmul")
    per_worker = collections.Counter(t.run_id for t in trials)
    assert len(per_worker) == WORKERS, per_worker  # every worker measured some
    configs = collections.Counter(json.dumps(t.config, sort_keys=True) for t in trials)
    duplicates = sum(n - 1 for n in configs.values())
    assert duplicates == 0, configs  # claims are checked after they are committed
    # a worker stops when the programs measured + claimed reach the budget; workers that check
    # at the same moment may each start one more. A config that compiles to a program measured
    # already is stored as a duplicate of it, not measured (at 32x64 large blocks clamp alike)
    measured = {t.db_id: t for t in trials if t.status != "duplicate"}
    programs = {t.fingerprint for t in trials}
    assert min(BUDGET, len(programs)) <= len(measured) <= BUDGET + WORKERS - 1
    for t in trials:
        if t.status == "duplicate":  # named after a trial any worker measured
            assert measured[t.duplicate_of].fingerprint == t.fingerprint
    best = min((t for t in trials if t.status == "ok"), key=lambda t: t.time_s)
    assert entry.trial_id == best.db_id and entry.time_s == best.time_s
    assert entry.config == best.config

    (summary,) = optuna.get_all_study_summaries(pg_storage_url.replace("://", "+psycopg://", 1))
    assert summary.study_name.startswith("matmul@")
    study = optuna.load_study(
        study_name=summary.study_name,
        storage=pg_storage_url.replace("://", "+psycopg://", 1),
    )
    given_up = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
    print(
        f"trials per worker {sorted(per_worker.values())}, duplicates {duplicates}, "
        f"study trials {len(study.trials)} ({len(given_up)} failed: repeats and given-up claims)"
    )


def test_a_finished_shared_study_leaves_nothing_queued_or_running(tmp_path, monkeypatch):
    from autotune.search import studies
    from autotune.search.loop import run_search
    from autotune.space import Param, Space
    from autotune.trial import Evaluation

    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    space = Space((Param("b", tuple(range(12))),))
    valid = [{"b": b} for b in range(12)]

    def evaluate(config):
        return Evaluation.of(config, 1.0 + config["b"])

    # a worker killed between asking for a trial and claiming it leaves it RUNNING, unclaimed
    monkeypatch.setattr(studies, "HEARTBEAT_S", 0.5)
    orphan = studies.SharedStudy(storage, "s", None).study.ask()
    time.sleep(2.0)  # older than the grace period of three heartbeats
    found = run_search(
        space,
        None,
        evaluate,
        n_trials=4,
        strategy="grid",
        valid=valid,
        storage=storage,
        study_name="s",
    )
    assert len(found) == 4
    study = optuna.load_study(study_name="s", storage=storage)
    states = {t.state for t in study.trials}
    assert optuna.trial.TrialState.WAITING not in states  # the grid's unused queue is closed
    assert study.trials[orphan.number].state == optuna.trial.TrialState.FAIL
    assert optuna.trial.TrialState.RUNNING not in states


def test_a_later_worker_judges_the_stored_winner_side_by_side(tmp_path, db_url):
    import sqlite3

    from toy_kernels import make_input, scale

    import autotune

    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    x = make_input(rows=32)  # block_rows 8, 16, 32 fit
    autotune.tune(scale, [x], n_trials=2, db=db_url, storage=storage, strategy="grid")
    (first,) = TuningDB(db_url).query()
    conn = sqlite3.connect(db_url)
    with conn:  # a lucky sample on the first worker's machine: a figure 1000x too fast
        conn.execute("UPDATE autotune_results SET time_s = time_s / 1000")
    conn.close()
    second = autotune.tune(scale, [x], n_trials=3, db=db_url, storage=storage, strategy="grid")
    assert first.config in [f.config for f in second.finalists]  # re-measured side by side
    (entry,) = TuningDB(db_url).query()
    assert entry.config == second.best_config
    assert entry.time_s == pytest.approx(second.best_time_s)  # not the lucky figure


def test_a_winner_stored_while_another_worker_chose_its_own_is_judged_side_by_side(
    tmp_path, db_url, monkeypatch
):
    import sqlite3

    from toy_kernels import make_input, scale

    import autotune

    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    x = make_input(rows=32)
    autotune.tune(scale, [x], n_trials=2, db=db_url, storage=storage, strategy="grid")
    conn = sqlite3.connect(db_url)
    with conn:  # a lucky sample on the first worker's machine: a figure 1000x too fast
        conn.execute("UPDATE autotune_results SET time_s = time_s / 1000")
    conn.close()
    # two workers finishing together: the second looked for a stored winner before the first
    # had stored it, and finds it only when it stores its own
    monkeypatch.setattr(TuningDB, "best", lambda self, key: None)
    second = autotune.tune(scale, [x], n_trials=3, db=db_url, storage=storage, strategy="grid")
    (entry,) = TuningDB(db_url).query()
    assert entry.config == second.best_config
    assert entry.time_s == pytest.approx(second.best_time_s)  # not the lucky figure


def test_a_later_worker_of_a_study_stores_duplicates_of_the_programs_an_earlier_one_measured(
    tmp_path, db_url
):
    import jax.numpy as jnp

    import autotune
    from autotune.kernels import softmax

    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    x = jnp.ones((16, 128), jnp.float32)  # block_rows 16 to 128 are clamped to 16 rows: one program
    first = autotune.tune(softmax, [x], n_trials=1, db=db_url, storage=storage, strategy="grid")
    (measured,) = first.trials
    assert measured.config == {"block_rows": 64} and measured.status == "ok"  # the default
    second = autotune.tune(softmax, [x], n_trials=3, db=db_url, storage=storage, strategy="grid")
    by_rows = {t.config["block_rows"]: t for t in second.trials}  # the study's, both workers'
    assert by_rows[8].status == "ok" and by_rows[8].fingerprint != measured.fingerprint
    for rows in (16, 32, 128):  # not measured again: the first worker's trial is named
        assert by_rows[rows].status == "duplicate", by_rows[rows]
        assert by_rows[rows].duplicate_of == measured.db_id
        assert by_rows[rows].fingerprint == measured.fingerprint and by_rows[rows].time_s is None
    assert second.n_duplicates == 3 and "compile to 2 distinct programs" in second.programs_note
    stored = {t.config["block_rows"]: t for t in TuningDB(db_url).trials(kernel="softmax")}
    assert stored[32].status == "duplicate" and stored[32].duplicate_of == measured.db_id
