"""How a candidate is timed and how long a device worker may take: values a tuning run's
settings hold (autotune.tuning.settings), below the measurement and the worker that use them, so
that choosing settings loads neither."""

from __future__ import annotations

from dataclasses import dataclass

TIMERS = ("cupti", "trace", "wall")


@dataclass(frozen=True)
class TimingPolicy:
    """How long to time a candidate: repetitions until the spread is small or time runs out."""

    warmup: int = 2  # calls before timing
    warmup_s: float = 0.025  # and, with a device timer, at least this long (clocks ramp up)
    min_reps: int = 5  # samples per batch; a candidate gets at least one batch
    max_reps: int = 200
    target_spread: float = 0.05  # (p90 - p10) / median at which more samples add little
    max_time_s: float = 1.0  # per candidate, timed part only
    timer: str = "auto"  # "auto" (the best available, see measure.timer_order), or one of TIMERS


DEFAULT_POLICY = TimingPolicy()


@dataclass(frozen=True)
class WorkerLimits:
    """Per-candidate time limits of a device worker, in seconds."""

    compile_s: float = 300.0  # tracing, lowering and compiling one candidate
    run_s: float = 120.0  # the verifying run and every timed repetition of one candidate
    start_s: float = 300.0  # starting a worker: importing JAX and the kernel, taking the inputs


DEFAULT_LIMITS = WorkerLimits()
