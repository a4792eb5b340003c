"""The tuning database on the real PostgreSQL server."""

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from toy_kernels import make_input, scale

import autotune
from autotune import TuningDB

pytestmark = pytest.mark.postgres


def test_tune_and_lookup_through_postgres(pg_url):
    x = make_input(rows=32)
    result = autotune.tune(scale, [x], n_trials=2, db=pg_url, seed=0)
    with TuningDB(pg_url) as db:
        (entry,) = db.query(kernel="scale")
        assert entry.config == result.best_config
        assert len(db.trials(kernel="scale")) == 2
    autotune.configure(db=pg_url)
    assert scale.explain(x)["source"] == "db"


@pytest.mark.slow
def test_concurrent_tunes_of_one_key_share_its_budget_in_the_postgres_database(
    pg_url, tmp_path, subprocess_env
):
    # 3 `autotune tune` processes of one key, no --storage: the study lives in the tuning
    # database, so the 3 measure the budget of 4 between them (each alone measured 4: 12).
    # Gathered at the reference check, none is done before the last has joined the study, so
    # the three search it together (the race that more processes would run too); a budget
    # not shared would show as up to 12 measured
    gather = tmp_path / "gather"
    gather.mkdir()
    env = {**subprocess_env, "TOY_GATHER_DIR": str(gather), "TOY_GATHER_N": "3"}
    argv = ["tune", "toy_kernels:gathered_scale", "--shape", "96x128", "--trials", "4"]
    argv += ["--no-isolate", "--finalists", "0", "--db", pg_url]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "autotune.cli", *argv],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).parent,
        )
        for _ in range(3)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-2000:]
    with TuningDB(pg_url) as db:
        trials = db.trials(kernel="gathered_scale")
        (entry,) = db.query(kernel="gathered_scale")
    measured = Counter(t.config["block_rows"] for t in trials if t.status != "duplicate")
    assert sum(measured.values()) <= 4 and max(measured.values()) == 1, measured
    assert entry.config in [t.config for t in trials]
