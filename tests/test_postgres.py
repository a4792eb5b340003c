"""The tuning database on the real PostgreSQL server."""

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
