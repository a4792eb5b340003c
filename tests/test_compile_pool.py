"""Compiling queued candidates ahead in a thread pool (forced on, though the CPU default is off)."""

import toy_kernels
from toy_kernels import make_input, picky_scale

import autotune
from autotune.measure.timing import TimingPolicy
from autotune.tuning.worker import WorkerLimits

FAST = TimingPolicy(warmup=1, min_reps=3, max_reps=20, max_time_s=0.05)
LIMITS = WorkerLimits(compile_s=20.0, run_s=20.0, start_s=60.0)


def tune_grid(compile_workers, kernel=picky_scale, rows=32, n_trials=3, **options):
    return autotune.tune(
        kernel,
        [make_input(rows=rows)],
        n_trials=n_trials,
        strategy="grid",
        policy=FAST,
        finalists=0,
        store=False,
        compile_workers=compile_workers,
        **options,
    )


def test_compiling_ahead_measures_the_same_configs_with_the_same_outcomes():
    toy_kernels.PICKY_TRACED.clear()
    ahead = tune_grid(2).trials
    traced = list(toy_kernels.PICKY_TRACED)
    alone = tune_grid(0).trials
    assert [(t.config, t.status) for t in ahead] == [(t.config, t.status) for t in alone]
    assert [t.status for t in ahead] == ["ok", "compile_error", "ok"]  # grid order 8, 16, 32
    assert "ValueError: picky_scale refuses block_rows=16" in ahead[1].error
    assert all(t.compile_s > 0 for t in (ahead[0], ahead[2]))
    # each config traced once (8 also for the oracle): the queued ones in pool threads, and
    # found there when measured
    assert sorted(b for b, _ in traced) == [8, 8, 16, 32]
    assert sorted(b for b, thread in traced if thread.startswith("autotune-compile")) == [16, 32]


def test_a_device_worker_compiles_ahead_and_reports_a_compile_error_when_measured():
    trials = tune_grid(2, isolate=True, limits=LIMITS).trials
    assert [(t.config["block_rows"], t.status) for t in trials] == [
        (8, "ok"),
        (16, "compile_error"),
        (32, "ok"),
    ]
    assert "picky_scale refuses block_rows=16" in trials[1].error
    assert trials[0].compile_s > 0 and trials[2].compile_s > 0


def test_a_crash_while_compiling_ahead_is_recorded_against_the_config_that_crashed():
    # 16 aborts the worker while it is traced, which starts ahead, as 8 is measured
    result = tune_grid(
        2, "toy_kernels:fragile_scale", rows=16, n_trials=2, isolate=True, limits=LIMITS
    )
    by_block = {t.config["block_rows"]: t for t in result.trials}
    assert by_block[8].status == "ok"
    assert by_block[16].status == "crashed" and "SIGABRT" in by_block[16].error
    assert result.restarts == 1  # after the crash ahead; 16 alone then crashed the last worker
