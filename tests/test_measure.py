"""Timers and the choice of the winner among finalists."""

import jax
import jax.numpy as jnp

from autotune.finalists import Finalist, rank, select
from autotune.measure import TimingPolicy, device_samples, summarise, time_compiled
from autotune.tuner import TrialRecord


def _compiled():
    x = jnp.ones((64, 64))
    return jax.jit(lambda a: a @ a).lower(x).compile(), [x]


def test_device_timer_finds_no_device_events_on_the_cpu_and_falls_back_to_wall():
    compiled, args = _compiled()
    assert device_samples(compiled, args, 3) == []  # a real profiler trace: host planes only
    timing = time_compiled(compiled, args, TimingPolicy(timer="device", max_time_s=0.05))
    assert timing.timer == "wall" and timing.n >= 5 and timing.min_s <= timing.median_s
    auto = time_compiled(compiled, args, TimingPolicy(max_time_s=0.05))
    assert auto.timer == "wall"  # "auto" picks the wall clock on the CPU


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
