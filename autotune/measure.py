"""Compile a candidate ahead of time, run it once, then time it; summarise the samples."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TimingPolicy:
    """How long to time a candidate: repetitions until the spread is small or time runs out."""

    warmup: int = 2
    min_reps: int = 5
    max_reps: int = 200
    target_spread: float = 0.05  # (p90 - p10) / median at which more samples add little
    max_time_s: float = 1.0  # per candidate, timed part only


DEFAULT_POLICY = TimingPolicy()


@dataclass(frozen=True)
class Timing:
    median_s: float
    min_s: float
    p10_s: float
    p90_s: float
    n: int
    timer: str  # which timer produced the figures: "wall" (block_until_ready round trips)

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
    compiled: Callable, args: Sequence[Any], policy: TimingPolicy = TimingPolicy()
) -> Timing:
    """Wall-clock time of one synchronised call, repeated per `policy`."""
    import jax

    for _ in range(policy.warmup):
        jax.block_until_ready(compiled(*args))
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
