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


def _counting_checks(monkeypatch) -> list[int]:
    """How many times the caller's block sizes were checked (once per trace, never per call)."""
    from autotune.runtime import lookup

    calls: list[int] = []
    check = lookup.check_given
    monkeypatch.setattr(lookup, "check_given", lambda *a: calls.append(1) or check(*a))
    return calls


def test_caller_block_sizes_that_break_the_constraints_are_an_error_eager_and_jitted(monkeypatch):
    import jax

    @autotune.autotuned(
        name="given_scale", space={"block_rows": [8, 12, 16]}, constraints=[toy_kernels.rows_divide]
    )
    def given_scale(x, *, block_rows=8, interpret=False):
        return toy_kernels._scale_call(x, block_rows, interpret)

    x = make_input(rows=64)  # 12 does not divide 64: its last rows would never be written
    refused = r"given_scale: block_rows=12 breaks rows_divide for f32\[64,128\].*block_rows 8, 16;"
    with pytest.raises(AutotuneError, match=refused):
        given_scale(x, block_rows=12)
    with pytest.raises(AutotuneError, match=refused):
        jax.jit(lambda x: given_scale(x, block_rows=12))(x)
    assert "block_rows=12 breaks rows_divide" in given_scale.explain(x, block_rows=12)["detail"]
    checks = _counting_checks(monkeypatch)
    for _ in range(3):  # a fitting choice runs as given; checked when jit traces it, once
        np.testing.assert_allclose(given_scale(x, block_rows=16), x * 2)
    assert len(checks) == 1


def test_caller_block_sizes_are_checked_on_the_general_path_too(monkeypatch):
    @autotune.autotuned(
        name="given_scale_by", space={"block_rows": [8, 16]}, constraints=[toy_kernels.rows_divide]
    )
    def given_scale_by(x, factor=2.0, *, block_rows=8, interpret=False):
        return toy_kernels._scale_call(x, block_rows, interpret) * (factor / 2.0)

    x = make_input(rows=64)  # a positional number: each call takes the general path
    with pytest.raises(AutotuneError, match=r"block_rows=24 breaks rows_divide.*block_rows 8, 16"):
        given_scale_by(x, 3.0, block_rows=24)
    checks = _counting_checks(monkeypatch)
    for _ in range(3):
        np.testing.assert_allclose(given_scale_by(x, 3.0, block_rows=16), x * 3)
    assert len(checks) == 1
