"""The oracle policy: interpret mode at the real shape where it is affordable; for a Mosaic GPU
kernel beyond that, the reference at the real shape after the default was checked under GPU
interpret mode at a reduced shape. Every trial records which oracle judged it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from third_party_mgpu import double_rows, double_rows_reference
from toy_kernels import rows_divide

import autotune
from autotune import TuningDB
from autotune.errors import KernelError
from autotune.measure import oracle
from autotune.measure.timing import TimingPolicy

pytest.importorskip("absl", reason="Mosaic GPU imports absl: pip install absl-py")
QUICK = TimingPolicy(warmup=1, min_reps=2, max_reps=3, max_time_s=0.05)


def register(fn, reference=double_rows_reference):
    return autotune.register(
        fn,
        name="oracle_double_rows",
        space={"block_rows": [32, 64]},
        constraints=[rows_divide],
        reference=reference,
    )


@pytest.fixture
def small_budget(monkeypatch):
    """GPU interpret mode judges at most one 128x128 input here, and reduces to 128 rows."""
    monkeypatch.setattr(oracle, "GPU_INTERPRET_MAX_ELEMENTS", 128 * 128)
    monkeypatch.setattr(oracle, "REDUCED_DIM", 128)


def test_small_shapes_are_judged_by_gpu_interpret_mode(small_budget, db_url):
    kernel = register(double_rows)
    x = jax.random.normal(jax.random.key(0), (128, 128), jnp.float32)
    result = autotune.tune(kernel, [x], n_trials=2, strategy="grid", policy=QUICK, finalists=0)
    assert result.oracle == "interpret"
    with TuningDB(db_url) as db:
        assert {t.oracle for t in db.trials(kernel="oracle_double_rows")} == {"interpret"}


def test_beyond_the_budget_the_reference_judges_and_a_wrong_candidate_is_rejected(
    small_budget, db_url
):
    def double_rows_wrong_at_32(x, *, block_rows=64):
        out = double_rows(x, block_rows=block_rows)
        return out + 1.0 if block_rows == 32 else out

    kernel = register(double_rows_wrong_at_32)
    x = jax.random.normal(jax.random.key(0), (512, 128), jnp.float32)
    result = autotune.tune(kernel, [x], n_trials=2, strategy="grid", policy=QUICK, finalists=0)
    assert result.oracle == "reference"
    status = {t.config["block_rows"]: t.status for t in result.trials}
    assert status == {64: "ok", 32: "rejected"}
    assert result.best_config == {"block_rows": 64}
    with TuningDB(db_url) as db:
        assert {t.oracle for t in db.trials(kernel="oracle_double_rows")} == {"reference"}
    np.testing.assert_array_equal(np.asarray(kernel(x)), np.asarray(x) * 2)


def test_the_default_is_still_checked_in_interpret_mode_at_a_reduced_shape(small_budget):
    checked = []

    def double_rows_wrong_by_default(x, *, block_rows=64):
        checked.append(x.shape)
        out = double_rows(x, block_rows=block_rows)
        return out + 1.0 if block_rows == 64 else out

    kernel = register(double_rows_wrong_by_default)
    x = jnp.ones((512, 128), jnp.float32)
    with pytest.raises(KernelError, match="default configuration disagrees with its reference"):
        oracle.make_oracle(kernel.spec, {"block_rows": 64}, [x], {}, "mosaic_gpu")
    assert (128, 128) in checked  # under GPU interpret mode, at the reduced shape


def test_without_a_reference_a_shape_beyond_the_budget_has_no_oracle(small_budget):
    kernel = register(double_rows, reference=None)
    x = jnp.ones((512, 128), jnp.float32)
    with pytest.raises(KernelError, match="no reference: register it with reference="):
        oracle.make_oracle(kernel.spec, {"block_rows": 64}, [x], {}, "mosaic_gpu")
