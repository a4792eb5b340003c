"""Choosing the winner: the best few candidates are re-measured interleaved, side by side,
until a sign test tells the fastest apart from the rest, or a time cap says they are within the
noise.

One pass of measurements ranks candidates that were timed minutes apart, each in its own
machine state; a lucky sample can win. The finalists (the fastest few, any candidate within
the noise band of the fastest, and the default as the reference) are timed again in rounds,
A B C A B C ..., each round `reps` calls of each. A round's figure of a finalist is its fastest
call in that round: interference from other work only ever adds time, so on a loaded machine
the minimum is what stays put while medians and spreads swell; a finalist's figure is the
median of its rounds' figures.

The test: the fastest finalist (by that figure) beats another when, paired round by round, it
was faster in so many rounds that a fair coin would do as well at most ALPHA of the time (a
one-sided sign test: 5 of 5 rounds, 8 of 9, ...). Rounds are added ROUNDS at a time while some
finalist more than MIN_TIE slower is not yet beaten, up to MAX_ROUNDS or MAX_S seconds; one still
not beaten then is within the noise (`undecided`). The winner is, among the fastest and those
it did not beat, the configuration closest to the default (so repeated runs pick the same)
unless the fastest is clearly ahead of it (CLEAR: faster in the first pass and side by side):
a candidate that both measurements put clearly ahead never loses a tie.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.measure.timing import Timing, summarise
from autotune.registry.spec import config_distance
from autotune.trial import config_id

ROUNDS = 5  # rounds per batch: the fewest in which the sign test can decide (1/32 < ALPHA)
MAX_ROUNDS = 20  # no batch is begun beyond this many rounds ...
MAX_S = 1.5  # ... or this many seconds of re-measurement
ROUND_S = 0.02  # timed seconds of the fastest finalist per round
MAX_REPS = 50
ALPHA = 0.05  # the sign test's level: a finalist is beaten when p <= ALPHA
MIN_TIE = 0.01  # figures closer than 1% are a tie however the rounds fall
CLEAR = 0.10  # clearly ahead: at least 10% faster in the first pass and side by side


@dataclass(frozen=True)
class Finalist:
    config: dict[str, Any]
    first_s: float  # the median of its first measurement
    timing: Timing | None  # the interleaved re-measurement, all samples (None: not re-measured)
    distance: float  # config_distance to the default
    rounds: tuple[float, ...] = ()  # its fastest call in each interleaved round

    @property
    def time_s(self) -> float:
        """The median of its rounds' figures; the first measurement's without them."""
        if self.rounds:
            return statistics.median(self.rounds)
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
    """Re-measure the finalists (see `select`) on `worker`, interleaved, in batches of ROUNDS
    rounds until none is `undecided` or the caps; ranked by `rank`. Falls back to the first
    figures where the worker fails before any round."""
    chosen = select(trials, default, n, also)
    finalists = [
        Finalist(t.config, t.time_s, None, config_distance(t.config, default)) for t in chosen
    ]
    if len(chosen) < 2:
        return finalists
    reps = max(1, min(MAX_REPS, int(ROUND_S / max(chosen[0].time_s, 1e-9))))
    samples: list[list[float]] = [[] for _ in chosen]
    start = time.perf_counter()
    while len(samples[0]) < MAX_ROUNDS * reps and time.perf_counter() - start < MAX_S:
        measured = worker.interleaved([t.config for t in chosen], ROUNDS, reps)
        if measured is None:  # the worker died: the rounds taken so far stand
            break
        for out, batch in zip(samples, measured[0]):
            out += batch
        finalists = [
            dataclasses.replace(f, timing=summarise(s, measured[1]), rounds=round_minima(s, reps))
            for f, s in zip(finalists, samples)
        ]
        if not undecided(finalists):
            break
    return rank(finalists)


def round_minima(samples: Sequence[float], reps: int) -> tuple[float, ...]:
    """The fastest of each round's `reps` samples (taken round after round)."""
    return tuple(min(samples[i : i + reps]) for i in range(0, len(samples) - reps + 1, reps))


def beats(a: Finalist, b: Finalist) -> bool:
    """Whether `a` was faster than `b` in so many interleaved rounds (ties left out) that a
    fair coin would do as well at most ALPHA of the time."""
    wins = sum(x < y for x, y in zip(a.rounds, b.rounds))
    n = wins + sum(x > y for x, y in zip(a.rounds, b.rounds))
    return n > 0 and sum(math.comb(n, k) for k in range(wins, n + 1)) / 2**n <= ALPHA


def undecided(finalists: Sequence[Finalist]) -> list[Finalist]:
    """The finalists more than MIN_TIE slower than the fastest that it has not beaten in the
    rounds taken (none without rounds: first-pass figures are all there is to go by)."""
    fastest = min(finalists, key=lambda f: f.time_s)
    return [
        f
        for f in finalists
        if f.rounds and f.time_s > fastest.time_s * (1 + MIN_TIE) and not beats(fastest, f)
    ]


def rank(finalists: Sequence[Finalist]) -> list[Finalist]:
    """The winner first (see the module docstring), then the rest by time."""
    by_time = sorted(finalists, key=lambda f: f.time_s)
    fastest = by_time[0]
    tied = [fastest, *undecided(by_time)]
    tied += [f for f in by_time if f not in tied and f.time_s <= fastest.time_s * (1 + MIN_TIE)]
    winner = min(tied, key=lambda f: (f.distance, f.time_s))
    if winner is not fastest and clearly_ahead(fastest, winner):
        winner = fastest
    return [winner] + [f for f in by_time if f is not winner]


def clearly_ahead(a: Finalist, b: Finalist) -> bool:
    """Whether `a` is faster than `b` by more than CLEAR both in the first pass and side by
    side."""
    return a.first_s < b.first_s * (1 - CLEAR) and a.time_s < b.time_s * (1 - CLEAR)
