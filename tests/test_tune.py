"""Tuning end to end on CPU: real Optuna, real interpret mode, a real SQLite file."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import toy_kernels
from toy_kernels import buggy_scale, make_input, scale

import autotune
from autotune import TuningDB
from autotune.errors import SpaceError
from autotune.kernels import matmul, matmul_reference


@pytest.fixture(scope="module")
def tuned_matmul(tmp_path_factory):
    """One small matmul tuning run shared by the tests that read its results."""
    db = str(tmp_path_factory.mktemp("tune") / "t.db")
    x = jax.random.normal(jax.random.key(0), (64, 128), jnp.float32)
    y = jax.random.normal(jax.random.key(1), (128, 32), jnp.float32)
    result = autotune.tune(matmul, [x, y], n_trials=6, db=db, seed=0)
    return db, result, x, y


def test_tuning_stores_a_best_entry_that_revalidates_and_is_correct(tuned_matmul):
    db, result, x, y = tuned_matmul
    (entry,) = TuningDB(db).query(kernel="matmul")
    assert entry.config == result.best_config
    # the winner's figure is its interleaved re-measurement, side by side with the default's
    assert entry.time_s == result.best_time_s == result.finalists[0].time_s
    assert result.finalists[0].config == result.best_config
    assert any(f.config == result.default_config for f in result.finalists)
    assert result.best_config in [t.config for t in result.trials if t.status == "ok"]
    # the budget counts distinct programs: a configuration compiling to one measured already is
    # stored as a duplicate of it, outside the count
    measured = [t for t in result.trials if t.status != "duplicate"]
    assert entry.n_trials == len(measured) == 6
    assert entry.key.platform == "cpu" and entry.key.backend == "interpret"
    assert entry.key.signature == "f32[64,128],f32[128,32]"
    assert entry.jax_version == jax.__version__
    assert entry.speedup == pytest.approx(result.default_time_s / result.best_time_s)
    space = matmul.spec.space("cpu")
    assert space.check_stored(entry.config) is None
    out = matmul(x, y, **entry.config)
    np.testing.assert_allclose(out, matmul_reference(x, y), rtol=1e-5, atol=1e-5)
    trials = TuningDB(db).trials(kernel="matmul")
    timed = [t for t in trials if t.status != "duplicate"]
    assert len(timed) == 6 and all(t.status == "ok" and t.n_reps >= 5 for t in timed)
    assert all(t.time_p10_s <= t.time_s <= t.time_p90_s for t in timed)
    # which proposals clamp to a program measured already depends on the timings (N = 32 makes
    # block_n 64 and 128 one program); each such row names the measured one
    ids = {t.db_id for t in timed}
    assert all(t.duplicate_of in ids for t in trials if t.status == "duplicate")
    best_trial = next(t for t in trials if t.db_id == entry.trial_id)
    assert best_trial.config == entry.config


def test_divergent_candidate_is_rejected_and_never_best(db_url):
    x = make_input(rows=64)
    result = autotune.tune(buggy_scale, [x], n_trials=10, db=db_url, strategy="grid")
    by_block = {t.config["block_rows"]: t for t in result.trials}
    assert set(by_block) == {8, 16, 32}
    assert by_block[32].status == "rejected"
    assert "max relative error" in by_block[32].error
    assert by_block[8].status == by_block[16].status == "ok"
    assert result.best_config["block_rows"] != 32
    (entry,) = TuningDB(db_url).query(kernel="buggy_scale")
    assert entry.config["block_rows"] != 32 and entry.n_rejected == 1
    stored = {
        t.config["block_rows"]: t.status for t in TuningDB(db_url).trials(kernel="buggy_scale")
    }
    assert stored[32] == "rejected"


def test_constraint_violations_are_never_compiled_nor_counted(db_url):
    x = make_input(rows=48)  # 48 rows: block_rows 32 does not divide it
    toy_kernels.TRACED["scale"].clear()
    result = autotune.tune(scale, [x], n_trials=50, db=db_url, seed=1)
    assert sorted(t.config["block_rows"] for t in result.trials) == [8, 12, 16, 24]
    traced = {c["block_rows"] for c in toy_kernels.TRACED["scale"]}
    assert 32 not in traced and traced == {8, 12, 16, 24}
    assert len(TuningDB(db_url).trials(kernel="scale")) == 4


def test_repeated_configurations_are_measured_once(db_url):
    x = make_input(rows=48)  # four valid configs, a budget of three: the sampler must choose
    result = autotune.tune(scale, [x], n_trials=3, db=db_url, strategy="tpe", seed=3)
    configs = [t.config["block_rows"] for t in result.trials]
    assert len(configs) == len(set(configs)) == 3


def test_no_valid_configuration_is_a_clear_error(db_url):
    x = make_input(rows=7)  # no candidate divides 7
    with pytest.raises(
        SpaceError, match=r"no configuration of scale's cpu space .* fits f32\[7,128\]"
    ):
        autotune.tune(scale, [x], n_trials=3, db=db_url)
    assert TuningDB(db_url).query() == []


def test_a_kept_default_says_why_when_a_candidate_looked_faster():
    from autotune.measure.finalists import Finalist, rank
    from autotune.measure.timing import Timing
    from autotune.tuning.result import TuneResult

    def finalist(config, first_s, median_s, distance):
        timing = Timing(median_s, median_s, median_s * 0.99, median_s * 1.01, 10, "wall")
        return Finalist(config, first_s, timing, distance)

    # faster by 10% at first; side by side 0.1% slower: a tie, which the default wins
    finalists = rank(
        [finalist({"b": 16}, 0.9e-3, 1.001e-3, 1.0), finalist({"b": 8}, 1e-3, 1e-3, 0)]
    )
    assert finalists[0].config == {"b": 8}
    kept = TuneResult("k", None, {"b": 8}, 1e-3, {"b": 8}, 1e-3, finalists=finalists)
    assert kept.speedup == 1.0
    assert kept.why_default_kept.startswith(
        "b=16 measured faster at first (0.9000 ms against the default's 1.0000 ms), but side by "
        "side with the default (1.0010 ms against 1.0000 ms) not beyond the noise"
    )
    won = TuneResult("k", None, {"b": 16}, 0.9e-3, {"b": 8}, 1e-3, finalists=finalists)
    assert won.why_default_kept is None


def test_a_candidate_above_the_memory_bound_is_compiled_but_never_run(db_url):
    from autotune.kernels import softmax
    from autotune.measure.compiling import compile_config

    x = jnp.ones((16, 128), jnp.float32)
    peak = {
        rows: compile_config(softmax.spec, {"block_rows": rows}, [x], {}).memory for rows in (8, 64)
    }
    peak = {rows: m["memory_peak_bytes"] for rows, m in peak.items()}
    assert peak[8] > peak[64]  # 8-row blocks need more temporaries than one 16-row block
    result = autotune.tune(
        softmax, [x], n_trials=5, strategy="grid", max_memory=peak[64], db=db_url
    )
    by_rows = {t.config["block_rows"]: t for t in result.trials}
    over = by_rows[8]
    assert over.status == "over_memory" and "above the bound" in over.error
    assert over.memory_peak_bytes == peak[8] and over.time_s is None and over.max_error is None
    assert by_rows[64].status == "ok" and by_rows[64].memory_peak_bytes == peak[64]
    assert by_rows[16].status == "duplicate" and by_rows[16].memory_peak_bytes == peak[64]
    assert result.best_config == {"block_rows": 64}
    stored = {t.config["block_rows"]: t for t in TuningDB(db_url).trials(kernel="softmax")}
    assert stored[8].status == "over_memory" and stored[8].memory_peak_bytes == peak[8]
