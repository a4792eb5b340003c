"""Compile a candidate ahead of time, run it once, then time it; summarise the samples."""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TimingPolicy:
    """How long to time a candidate: repetitions until the spread is small or time runs out."""

    warmup: int = 2
    min_reps: int = 5
    max_reps: int = 200
    target_spread: float = 0.05  # (p90 - p10) / median at which more samples add little
    max_time_s: float = 1.0  # per candidate, timed part only
    timer: str = "auto"  # "wall", "device" (a profiler trace), "auto": device on TPU and GPU


DEFAULT_POLICY = TimingPolicy()


@dataclass(frozen=True)
class Timing:
    median_s: float
    min_s: float
    p10_s: float
    p90_s: float
    n: int
    timer: str  # which timer produced the figures: "wall" (block_until_ready round trips)
    # or "device" (the module's time on the device, from a jax.profiler trace)

    @property
    def spread(self) -> float:
        return (self.p90_s - self.p10_s) / self.median_s if self.median_s > 0 else 0.0

    def as_trial_fields(self) -> dict[str, Any]:
        return {
            "time_s": self.median_s,
            "time_min_s": self.min_s,
            "time_p10_s": self.p10_s,
            "time_p90_s": self.p90_s,
            "n_reps": self.n,
            "timer": self.timer,
        }


def summarise(samples: Sequence[float], timer: str = "wall") -> Timing:
    s = sorted(samples)
    n = len(s)
    return Timing(
        median_s=statistics.median(s),
        min_s=s[0],
        p10_s=s[int(0.1 * (n - 1))],
        p90_s=s[int(round(0.9 * (n - 1)))],
        n=n,
        timer=timer,
    )


def compile_ahead(fn: Callable, args: Sequence[Any]) -> tuple[Callable, float]:
    """`jax.jit(fn).lower(*args).compile()`, and how long it took (outside any timed region)."""
    import jax

    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled, time.perf_counter() - start


def time_compiled(
    compiled: Callable,
    args: Sequence[Any],
    policy: TimingPolicy = TimingPolicy(),
    arg_sets: Sequence[Sequence[Any]] = (),
) -> Timing:
    """Time one call, repeated per `policy`: on the device where the platform has a device
    timer and the policy allows it, else wall-clock around `block_until_ready`. Calls rotate
    among `args` and `arg_sets` (copies of them: see `rotation_sets`)."""
    import jax

    if arg_sets:
        compiled = _rotating(compiled, [args, *arg_sets])
    for _ in range(policy.warmup):
        jax.block_until_ready(compiled(*args))
    timer = policy.timer
    if timer == "auto":
        timer = "device" if jax.default_backend() in DEVICE_TIMER_PLATFORMS else "wall"
    if timer == "device":
        timing = _time_on_device(compiled, args, policy)
        if timing is not None:
            return timing
        log.info("no device events in the profiler trace: timing by wall clock")
    samples: list[float] = []
    deadline = time.perf_counter() + policy.max_time_s
    while len(samples) < policy.max_reps:
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        samples.append(time.perf_counter() - start)
        if len(samples) >= policy.min_reps and (
            time.perf_counter() > deadline or summarise(samples).spread <= policy.target_spread
        ):
            break
    return summarise(samples)


# Platforms whose profiler traces carry per-module device events, and where those are found.
DEVICE_TIMER_PLATFORMS = ("tpu", "gpu", "cuda", "rocm")
DEVICE_PLANE_PREFIXES = ("/device:TPU:", "/device:GPU:")
MODULE_LINE = "XLA Modules"


def _time_on_device(compiled: Callable, args: Sequence[Any], policy: TimingPolicy) -> Timing | None:
    """Device time per call from jax.profiler traces parsed in memory, in batches until the
    spread target or the time cap; None where the trace has no device module events (the CPU).

    Written for TPU and GPU, where XLA records each executed module on the device plane's
    "XLA Modules" line; this excludes host dispatch. Not exercised on a CPU-only host.
    """
    samples: list[float] = []
    deadline = time.perf_counter() + policy.max_time_s
    while len(samples) < policy.max_reps:
        batch = device_samples(compiled, args, min(policy.min_reps, policy.max_reps - len(samples)))
        if not batch:
            return None
        samples += batch
        if time.perf_counter() > deadline or summarise(samples).spread <= policy.target_spread:
            break
    return summarise(samples, "device")


def device_samples(compiled: Callable, args: Sequence[Any], n: int) -> list[float]:
    """`n` synchronised calls under a profiler session; each call's device time in seconds
    ([] where the trace has none)."""
    import jax

    try:  # the in-memory session is not public API; without it there is no device timer
        from jax._src.lib import _profiler
    except ImportError:
        return []
    session = _profiler.ProfilerSession()
    try:
        for _ in range(n):
            jax.block_until_ready(compiled(*args))
    finally:
        xspace = session.stop()
    data = jax.profiler.ProfileData.from_serialized_xspace(xspace)
    planes = sorted(
        (p for p in data.planes if p.name.startswith(DEVICE_PLANE_PREFIXES)), key=lambda p: p.name
    )
    for plane in planes[:1]:  # a worker owns one device: its first plane
        for line in plane.lines:
            if line.name == MODULE_LINE:
                times = [e.duration_ns * 1e-9 for e in line.events]
                return times[-n:] if len(times) >= n else []
    return []


def rotation_sets(args: Sequence[Any], cache_bytes: int, max_sets: int = 8) -> list[list[Any]]:
    """Extra copies of `args` (distinct device buffers), enough that the sets together outgrow
    a cache of `cache_bytes`: each timed call then reads inputs the previous calls did not."""
    import jax
    import jax.numpy as jnp

    size = sum(getattr(a, "nbytes", 0) for a in args)
    if size == 0 or size >= cache_bytes:
        return []
    n = min(max_sets, -(-2 * cache_bytes // size)) - 1
    return [[jnp.copy(a) if isinstance(a, jax.Array) else a for a in args] for _ in range(n)]


def _rotating(compiled: Callable, sets: list[Sequence[Any]]) -> Callable:
    calls = iter(range(1 << 62))

    def call(*_ignored: Any) -> Any:
        return compiled(*sets[next(calls) % len(sets)])

    return call
