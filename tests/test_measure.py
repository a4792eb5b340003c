"""Timers and the choice of the winner among finalists."""

import dataclasses
import logging
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from autotune.measure import finalists
from autotune.measure.finalists import Finalist, rank, remeasure, round_minima, select
from autotune.measure.timing import (
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
    with caplog.at_level(logging.WARNING, logger="autotune.measure.timing"):
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


def test_a_side_by_side_warms_each_call_up_as_a_candidate_is_before_it_is_timed_alone():
    # with a device timer first in line (the trace's, asked for here), every call is warmed up
    # for warmup_s, as time_compiled warms a candidate (clocks ramp up), not for 2 calls only
    compiled, args = _compiled()
    stamps = {"a": [], "b": []}

    def call(name):
        def run(*a):
            stamps[name].append(time.perf_counter())
            return compiled(*a)

        return run

    policy = TimingPolicy(timer="trace", warmup=2, warmup_s=0.2)
    interleaved([call("a"), call("b")], [args], rounds=1, reps=1, policy=policy)
    # b's warm-up began after a's ended: a's first calls span at least warmup_s
    a_warm = [t for t in stamps["a"] if t < stamps["b"][0]]
    assert a_warm[-1] - a_warm[0] >= 0.2 - 0.05 and len(a_warm) > 2
    # the wall clock alone: the warm-up is the 2 calls
    stamps = {"a": [], "b": []}
    interleaved([call("a"), call("b")], [args], 1, 1, TimingPolicy(timer="wall", warmup_s=0.2))
    assert len([t for t in stamps["a"] if t < stamps["b"][0]]) == 2


def _finalist(block, samples, default=8):
    from autotune.registry.spec import config_distance

    config = {"block": block}
    distance = config_distance(config, {"block": default})
    return Finalist(config, samples[0], summarise(samples), distance, tuple(samples))


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


# matmul_variants at 256^3 side by side on a loaded 2-core host, 3 calls a round (ms), in the
# shape seen there (first passes 0.68 and 2.60 ms): XLA's calls are 4x faster, but a call that
# the load interrupts takes 5-10x as long, and the spread swamps every median.
XLA_MS = [0.61, 4.9, 0.66, 0.63, 0.7, 6.2, 5.8, 0.64, 0.69, 0.62, 3.9, 0.71, 0.65, 7.7, 0.6]
PALLAS_MS = [2.6, 2.7, 11.0, 2.64, 9.8, 2.9, 2.62, 12.5, 2.75, 2.58, 2.7, 10.1, 2.66, 2.6, 13.0]


def _member(name, first_ms, samples_ms, distance):
    samples = [t * 1e-3 for t in samples_ms]
    timing = summarise(samples)
    return Finalist({"variant": name}, first_ms * 1e-3, timing, distance, round_minima(samples, 3))


def test_a_candidate_faster_in_every_interleaved_round_wins_on_a_loaded_host():
    xla = _member("xla", 0.68, XLA_MS, 1.0)
    pallas = _member("matmul", 2.60, PALLAS_MS, 0.0)  # the first member: ties go to it
    assert xla.rounds == (0.61e-3, 0.63e-3, 0.64e-3, 0.62e-3, 0.6e-3)
    assert xla.timing.spread > 5  # the old tie margin (half the spread) made this a tie
    assert finalists.beats(xla, pallas) and not finalists.beats(pallas, xla)
    assert [f.config["variant"] for f in rank([pallas, xla])] == ["xla", "matmul"]


def test_finalists_not_told_apart_are_within_the_noise_and_the_default_kept():
    from autotune.tuning.result import TuneResult

    # 9% faster by its median round, but faster in 3 rounds of 5 only: not beaten
    near = _finalist(16, [1.0, 1.2, 1.0, 1.2, 1.0])
    default = _finalist(8, [1.1, 1.1, 1.1, 1.1, 1.1])
    assert finalists.undecided([near, default]) == [default]
    ranked = rank([near, default])
    assert ranked[0] is default
    result = TuneResult("k", None, {"block": 8}, 1.1, {"block": 8}, 1.1, finalists=ranked)
    assert result.within_noise == (
        "after 5 interleaved rounds the winner and block=16 were not told apart (sign test, "
        "autotune.measure.finalists): the choice is within the noise"
    )


def test_a_candidate_clearly_ahead_in_both_measurements_never_loses_a_tie():
    ahead = Finalist({"block": 64}, 0.5, None, 3.0, (0.5, 2.0, 0.5, 2.0, 0.5))
    default = Finalist({"block": 8}, 1.0, None, 0.0, (1.0,) * 5)
    assert not finalists.beats(ahead, default)  # 3 rounds of 5: within the noise
    assert rank([default, ahead])[0] is ahead  # yet 2x faster at first and side by side
    unclear = dataclasses.replace(ahead, first_s=0.95)  # not clearly ahead at first
    assert rank([default, unclear])[0] is default


class RecordedWorker:
    """Interleaved samples recorded earlier, handed out batch by batch (a device stand-in)."""

    def __init__(self, batches):
        self.batches = list(batches)
        self.asked = []

    def interleaved(self, configs, rounds, reps):
        self.asked.append((rounds, reps))
        return self.batches.pop(0), "wall"


def test_rounds_are_added_until_the_fastest_is_told_apart():
    trials = [TrialRecord({"block": b}, "ok", t, t, t, t, 5) for b, t in [(64, 0.01), (8, 0.0105)]]
    # ROUND_S / 10 ms: 2 calls a round; the first batch's rounds split 4 to 1 (p = 0.19), with
    # the next batch's 9 to 1 (p = 0.011)
    first = [[0.010, 0.011] * 5, [0.0105, 0.0106] * 4 + [0.0099, 0.0104]]
    second = [[0.010] * 10, [0.0105] * 10]
    worker = RecordedWorker([first, second, [[0.01] * 10] * 2])
    ranked = remeasure(worker, trials, {"block": 8}, n=2)
    assert worker.asked == [(finalists.ROUNDS, 2)] * 2  # decided after the second batch
    assert ranked[0].config == {"block": 64} and len(ranked[0].rounds) == 10


def test_finalists_are_the_fastest_few_the_noise_band_and_the_default():
    def trial(block, t, spread=0.0):
        return TrialRecord({"block": block}, "ok", t, t, t - spread, t + spread, 5)

    trials = [trial(64, 1.0, 0.1), trial(32, 1.15), trial(16, 1.3), trial(8, 3.0)]
    trials.append(TrialRecord({"block": 4}, "rejected"))
    chosen = [t.config["block"] for t in select(trials, {"block": 8}, n=1)]
    assert chosen == [64, 32, 8]  # 32 lies in 64's p10..p90 band; 8 is the default


def test_inputs_smaller_than_the_cache_rotate_among_distinct_copies():
    from autotune.measure.timing import rotation_sets

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

    from autotune.measure.compiling import Program
    from autotune.measure.timing import measure_candidate

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
