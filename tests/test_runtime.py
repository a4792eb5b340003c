"""The @autotuned lookup: stored config, nearest shape, defaults; inside and outside jit."""

import jax
import numpy as np
import pytest
from toy_kernels import make_input, scale

import autotune
from autotune import TuningDB
from autotune.device import current_device
from autotune.errors import AutotuneError


def store(db_url, x, block_rows):
    """Store a best entry for `scale` at x's shape, as a tuning run would."""
    sig = scale.spec.signature([x], {}, current_device())
    key = scale.spec.key(sig, current_device())
    with TuningDB(db_url) as db:
        db.put_best(
            key,
            {
                "config": {"block_rows": block_rows},
                "time_s": 1e-3,
                "n_trials": 1,
                "n_rejected": 0,
                "run_id": "test",
                "strategy": "grid",
                "timer": "wall",
                "jax_version": "x",
                "jaxlib_version": "x",
            },
        )
    autotune.configure()


def test_miss_falls_back_to_defaults_and_is_recorded(db_url):
    x = make_input(rows=64)
    info = scale.explain(x)
    assert info["source"] == "default" and info["config"] == {"block_rows": 8}
    np.testing.assert_allclose(scale(x), x * 2)
    (miss,) = TuningDB(db_url).misses(kernel="scale")
    assert miss["signature"] == "f32[64,128]"


def test_explain_is_a_question_and_records_no_miss(db_url):
    x = make_input(rows=64)
    for _ in range(3):
        assert scale.explain(x)["source"] == "default"
    assert TuningDB(db_url).misses() == []
    scale(x)  # a call is what model code asked for: counted once
    assert [m["count"] for m in TuningDB(db_url).misses()] == [1]


def test_stored_config_is_used_outside_and_inside_jit(db_url):
    x = make_input(rows=64)
    store(db_url, x, 16)
    info = scale.explain(x)
    assert info["source"] == "db" and info["config"] == {"block_rows": 16}
    assert info["key"]["signature"] == "f32[64,128]"
    np.testing.assert_allclose(scale(x), x * 2)
    jaxpr = jax.make_jaxpr(lambda a: scale(a) + 1)(x)
    text = str(jaxpr)
    assert "pallas_call" in text and "grid=(4,)" in text.replace(" ", "")  # 64 rows / 16
    np.testing.assert_allclose(jax.jit(lambda a: scale(a) + 1)(x), x * 2 + 1)


def test_caller_keyword_wins_over_the_tuned_value(db_url):
    x = make_input(rows=64)
    store(db_url, x, 16)
    assert scale.explain(x, block_rows=32)["config"] == {"block_rows": 32}
    assert "grid=(2,)" in str(jax.make_jaxpr(lambda a: scale(a, block_rows=32))(x)).replace(" ", "")


def test_nearest_tuned_shape_is_used_when_its_config_fits(db_url):
    store(db_url, make_input(rows=128), 32)
    store(db_url, make_input(rows=512), 16)
    near = scale.explain(make_input(rows=80))  # 32 does not divide 80; the next nearest is 512's 16
    assert near["source"] == "nearest" and near["config"] == {"block_rows": 16}
    assert scale.explain(make_input(rows=160))["config"] == {"block_rows": 32}  # 160 % 32 == 0


def test_strict_mode_raises_on_a_miss(db_url, monkeypatch):
    monkeypatch.setenv("PALLAS_AUTOTUNE_STRICT", "1")
    autotune.configure()
    with pytest.raises(AutotuneError, match="no tuned configuration for scale f32\\[64,128\\]"):
        scale(make_input(rows=64))
