"""Timers and the choice of the winner among finalists."""

import logging
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from autotune.finalists import Finalist, rank, select
from autotune.measure import (
    TimingPolicy,
    cupti_samples,
    device_times_from_trace,
    interleaved,
    summarise,
    time_compiled,
    timer_order,
    trace_samples,
    wall_samples,
)
from autotune.trial import TrialRecord

FIXTURES = Path(__file__).parent / "fixtures"
# A jax.profiler trace recorded on an NVIDIA H200: three synchronised calls of a Pallas (Triton
# backend) matmul, bf16 1024^3, one kernel launch each.
H200_TRACE = FIXTURES / "h200_pallas_matmul_3calls.xspace.pb"


def _compiled():
    x = jnp.ones((64, 64))
    return jax.jit(lambda a: a @ a).lower(x).compile(), [x]


def test_per_call_device_times_are_read_from_a_gpu_trace():
    xspace = H200_TRACE.read_bytes()
    times = device_times_from_trace(xspace, 3)
    assert times == pytest.approx([10.624e-6, 10.976e-6, 10.432e-6], rel=1e-9)
    # fewer calls than launches: the widest gap separates the calls, a call's kernels are summed
    assert device_times_from_trace(xspace, 2) == pytest.approx([10.624e-6, 21.408e-6])
    assert device_times_from_trace(xspace, 4) == []  # more calls than device events


def test_no_device_timer_reports_on_the_cpu_so_the_wall_clock_times_and_says_so(caplog):
    compiled, args = _compiled()
    sets = [args]
    # real calls: CUPTI is refused off a GPU, and the CPU's profiler trace has no device plane
    assert cupti_samples(compiled, sets, 0, 3) == []
    assert trace_samples(compiled, sets, 0, 3) == []
    assert len(wall_samples(compiled, sets, 0, 3)) == 3
    with caplog.at_level(logging.WARNING, logger="autotune.measure"):
        for _ in range(2):
            timing = time_compiled(compiled, args, TimingPolicy(timer="cupti", max_time_s=0.05))
            assert timing.timer == "wall" and timing.n >= 5 and timing.min_s <= timing.median_s
    assert sum("timing by 'wall'" in r.message for r in caplog.records) <= 1  # once a process
    assert time_compiled(compiled, args, TimingPolicy(max_time_s=0.05)).timer == "wall"


def test_the_timer_is_chosen_by_platform_best_first():
    assert timer_order("auto", "gpu") == ("cupti", "trace", "wall")
    assert timer_order("auto", "tpu") == ("trace", "wall")
    assert timer_order("auto", "cpu") == ("wall",)
    assert timer_order("auto", "metal") == ("wall",)  # a platform without backends of ours
    assert timer_order("trace", "gpu") == ("trace", "wall")
    with pytest.raises(ValueError, match="unknown timer 'gpu'"):
        timer_order("gpu", "gpu")


def test_finalists_are_timed_interleaved_by_the_timer_of_the_platform():
    compiled, args = _compiled()
    samples, timer = interleaved([compiled, compiled], [args], rounds=3, reps=2)
    assert timer == "wall" and [len(s) for s in samples] == [6, 6]


def _finalist(block, samples, default=8):
    from autotune.registry import config_distance

    config = {"block": block}
    return Finalist(
        config, samples[0], summarise(samples), config_distance(config, {"block": default})
    )


def test_a_tie_within_noise_goes_to_the_configuration_closest_to_the_default():
    near = _finalist(16, [1.004, 1.005, 1.006, 1.005, 1.004])  # 0.4% slower: within noise
    far = _finalist(256, [1.0, 1.001, 1.0, 1.002, 1.001])
    slow = _finalist(8, [1.5, 1.5, 1.5, 1.5, 1.5])  # the default itself, clearly slower
    assert [f.config["block"] for f in rank([far, slow, near])] == [16, 256, 8]
    assert [f.config["block"] for f in rank([near, far, slow])] == [16, 256, 8]  # order-free


def test_a_clear_winner_beats_a_closer_configuration():
    fast = _finalist(256, [1.0, 1.0, 1.01, 1.0, 1.0])
    near = _finalist(16, [1.2, 1.2, 1.21, 1.2, 1.2])
    assert rank([near, fast])[0].config == {"block": 256}


def test_finalists_are_the_fastest_few_the_noise_band_and_the_default():
    def trial(block, t, spread=0.0):
        return TrialRecord({"block": block}, "ok", t, t, t - spread, t + spread, 5)

    trials = [trial(64, 1.0, 0.1), trial(32, 1.15), trial(16, 1.3), trial(8, 3.0)]
    trials.append(TrialRecord({"block": 4}, "rejected"))
    chosen = [t.config["block"] for t in select(trials, {"block": 8}, n=1)]
    assert chosen == [64, 32, 8]  # 32 lies in 64's p10..p90 band; 8 is the default


def test_inputs_smaller_than_the_cache_rotate_among_distinct_copies():
    from autotune.measure import rotation_sets

    x = jnp.arange(256, dtype=jnp.float32)  # 1 KiB
    sets = rotation_sets([x], cache_bytes=4096)
    assert len(sets) == 7  # 8 sets of 1 KiB: twice the cache
    pointers = {s[0].unsafe_buffer_pointer() for s in sets} | {x.unsafe_buffer_pointer()}
    assert len(pointers) == 8 and all(bool((s[0] == x).all()) for s in sets)
    assert rotation_sets([x], cache_bytes=512) == []  # already larger than the cache

    seen = []

    def call(a):
        seen.append(a.unsafe_buffer_pointer())
        return a

    time_compiled(call, [x], TimingPolicy(warmup=0, min_reps=16, max_reps=16), sets)
    assert len(set(seen)) == 8 and seen[0] != seen[1]


def test_a_candidate_that_fails_while_it_is_timed_is_a_runtime_error_not_an_exception():
    from toy_kernels import make_input, scale

    from autotune.compiling import Program
    from autotune.measure import measure_candidate

    x = make_input(rows=32)
    calls = []

    def flaky(a):  # verifies on its first call, then fails (a device fault, say)
        calls.append(a)
        if len(calls) > 1:
            raise RuntimeError("the device faulted")
        return a * 2.0

    class CompiledAhead:
        def take(self, config):
            return Program("fingerprint", flaky, 0.01)

    record = measure_candidate(
        scale.spec, {"block_rows": 8}, [x], {}, x * 2.0, TimingPolicy(), pool=CompiledAhead()
    )
    assert record.status == "runtime_error" and "RuntimeError: the device faulted" in record.error
    assert record.max_error == 0.0 and record.compile_s == 0.01 and record.time_s is None
