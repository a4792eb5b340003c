"""Choosing the winner: the best few candidates are re-measured interleaved, side by side.

One pass of measurements ranks candidates that were timed minutes apart, each in its own
machine state; a lucky sample can win. The finalists (the fastest few, any candidate within
the noise band of the fastest, and the default as the reference) are timed again in rounds,
A B C A B C ..., and ties within the noise go to the configuration closest to the default,
so repeated runs pick the same winner.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.measure import Timing, summarise
from autotune.registry import config_distance
from autotune.trial import config_id

ROUNDS = 5
ROUND_S = 0.02  # timed seconds per finalist per round: enough repetitions to average jitter
MAX_REPS = 50
MIN_TIE = 0.01  # medians closer than 1% are a tie however quiet the machine


@dataclass(frozen=True)
class Finalist:
    config: dict[str, Any]
    first_s: float  # the median of its first measurement
    timing: Timing | None  # the interleaved re-measurement (None: not re-measured)
    distance: float  # config_distance to the default

    @property
    def time_s(self) -> float:
        return self.timing.median_s if self.timing else self.first_s


def select(
    trials: Sequence[Any], default: Mapping[str, Any], n: int, also: Sequence[Mapping] = ()
) -> list[Any]:
    """The ok trials worth re-measuring: the `n` fastest, any within the fastest one's
    p10..p90 band, the default's trial, and those of the configs `also` names."""
    ok = sorted((t for t in trials if t.status == "ok"), key=lambda t: t.time_s)
    if not ok:
        return []
    best = ok[0]
    band = best.time_s + (best.time_p90_s - best.time_p10_s)
    chosen = [t for i, t in enumerate(ok) if i < n or t.time_s <= band]
    wanted = {config_id(c) for c in (default, *also)}
    chosen += [t for t in ok if config_id(t.config) in wanted and t not in chosen]
    return chosen


def remeasure(
    worker: Any,
    trials: Sequence[Any],
    default: Mapping[str, Any],
    n: int = 3,
    also: Sequence[Mapping] = (),
) -> list[Finalist]:
    """Re-measure the finalists (see `select`) on `worker` (interleaved); fastest first, ties
    broken by closeness to the default. Falls back to the first figures if the worker fails."""
    chosen = select(trials, default, n, also)
    if not chosen:
        return []
    timings: list[Timing | None] = [None] * len(chosen)
    if len(chosen) > 1:
        reps = max(1, min(MAX_REPS, int(ROUND_S / max(chosen[0].time_s, 1e-9))))
        measured = worker.interleaved([t.config for t in chosen], ROUNDS, reps)
        if measured is not None:
            samples, timer = measured
            timings = [summarise(s, timer) for s in samples]
    finalists = [
        Finalist(
            config=t.config,
            first_s=t.time_s,
            timing=timing,
            distance=config_distance(t.config, default),
        )
        for t, timing in zip(chosen, timings)
    ]
    return rank(finalists)


def rank(finalists: Sequence[Finalist]) -> list[Finalist]:
    """The winner first: among those whose median ties the fastest (within the fastest one's
    half spread, at least MIN_TIE), the closest to the default; then the rest by time."""
    by_time = sorted(finalists, key=lambda f: f.time_s)
    fastest = by_time[0]
    tie = max(MIN_TIE, fastest.timing.spread / 2 if fastest.timing else 0.0)
    tied = [f for f in by_time if f.time_s <= fastest.time_s * (1 + tie)]
    winner = min(tied, key=lambda f: (f.distance, f.time_s))
    return [winner] + [f for f in by_time if f is not winner]
