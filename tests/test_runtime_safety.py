"""Model code at call time: a database that could not be opened is tried again, and a call
that no candidate fits never runs a configuration its kernel's constraints refuse."""

from __future__ import annotations

import sqlite3
import time

import numpy as np
import pytest
import toy_kernels
from test_reliability import store
from toy_kernels import make_input, scale

import autotune
import autotune.runtime.decorator
from autotune import TuningDB
from autotune.errors import AutotuneError


def test_a_database_locked_at_the_first_lookup_is_opened_again_later(tmp_path):
    path = tmp_path / "t.db"
    x = make_input(rows=48)
    store(path, x, block_rows=16)
    # a rollback-journal database held EXCLUSIVE by another connection cannot be opened
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA journal_mode=DELETE")
    holder.execute("BEGIN EXCLUSIVE")
    autotune.configure(db=path)
    toy_kernels.TRACED["scale"].clear()
    np.testing.assert_allclose(scale(x), x * 2)  # the fallback, at once
    holder.execute("COMMIT")
    holder.close()
    deadline = time.monotonic() + 10 * autotune.runtime.state.REOPEN_FIRST_S
    while toy_kernels.TRACED["scale"][-1] != {"block_rows": 16} and time.monotonic() < deadline:
        time.sleep(0.2)
        np.testing.assert_allclose(scale(x), x * 2)
    assert toy_kernels.TRACED["scale"] == [{"block_rows": 8}, {"block_rows": 16}]


def test_a_call_no_candidate_fits_is_refused_unless_block_sizes_are_passed():
    x = make_input(rows=100)  # none of 8, 12, 16, 24, 32 divides 100
    with pytest.raises(AutotuneError, match=r"scale f32\[100,128\].*rows_divide.*block_rows="):
        scale(x)
    explained = scale.explain(x)
    assert "rows_divide" in explained["detail"] and "no configuration" in explained["detail"]
    assert scale(x, block_rows=4).shape == x.shape  # the caller's choice is run as given


def test_only_calls_that_ran_leave_a_miss(db_url):
    with pytest.raises(AutotuneError):
        scale(make_input(rows=100))  # no candidate fits: it could never be tuned
    with pytest.raises(ValueError):
        scale(make_input(rows=64)[:, 0])  # the kernel fails on the user's call (1-D)
    scale(make_input(rows=64))
    scale(make_input(rows=64))
    with TuningDB(db_url) as db:
        assert [(m["signature"], m["count"]) for m in db.misses()] == [("f32[64,128]", 1)]
