"""Measure one candidate: compile it ahead of time, run it once, verify it, then time it;
summarise the samples.

Timers, best first (`timer_order`): on a GPU, "cupti" (the kernels' own durations from CUPTI,
through Mosaic GPU's extension), then "trace" (the same from a `jax.profiler` trace); on a TPU,
"trace" (the XLA module's time on the device); "wall" (the host's clock around synchronised
calls) everywhere as the last resort, and the only timer on the CPU. Whatever is available
decides, each Timing records which timer produced it, and a fall-back is logged once per
process. Only a timer that cannot time here falls back: a kernel that fails under any timer
raises, and is its trial's `runtime_error` with its text; no time that is not a finite number
of seconds is ever summarised.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune import backends
from autotune.device import DeviceInfo, current_device
from autotune.measure.compiling import Program, compile_config
from autotune.measure.policies import DEFAULT_POLICY, TIMERS, TimingPolicy
from autotune.measure.verify import compare
from autotune.trial import Config, ConfigId, TrialRecord, config_id

if TYPE_CHECKING:
    from autotune.measure.compile_pool import CompilePool
    from autotune.registry.spec import KernelSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Timing:
    median_s: float
    min_s: float
    p10_s: float
    p90_s: float
    n: int
    timer: str  # which timer produced the figures: one of TIMERS

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
    if not samples or not all(math.isfinite(t) and t >= 0 for t in samples):
        # a time that is not one never reaches a trial record, a report or the database
        raise ValueError(f"no valid time among {len(samples)} samples: {list(samples)[:5]}")
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


MAX_CACHED = 64  # verified executables kept per task, for the finalists


def measure_candidate(
    spec: KernelSpec,
    config: Config,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    oracle: Any,
    policy: TimingPolicy = DEFAULT_POLICY,
    on_compiled: Callable[[float], None] | None = None,
    arg_sets: Sequence[Sequence[Any]] = (),
    cache: dict[ConfigId, Any] | None = None,
    pool: CompilePool | None = None,
    known: Container[str] = (),
    max_memory: int | None = None,
) -> TrialRecord:
    """Compile, run once and verify, then time one candidate (rotating among `args` and
    `arg_sets`): its trial record. The compile is `pool`'s where it compiled the config ahead.
    A verified executable is kept in `cache` for the finalists' re-measurement.

    A candidate whose program's fingerprint is `known` (measured already) is neither compiled
    (unless the pool did so ahead) nor run: its record is a `duplicate` with that fingerprint.
    One whose compiled program's peak memory (where the compiler reports it) is above
    `max_memory` bytes is not run: `over_memory`. Every compiled candidate's record holds the
    compiler's memory figures. Failures become the record's status, never an exception.
    """
    config = dict(config)
    try:
        if pool is not None:
            program = pool.take(config)
        else:
            program = compile_config(spec, config, args, kwargs, known)
    except Exception as e:
        return TrialRecord(config, "compile_error", error=one_line(e))
    if on_compiled:
        on_compiled(program.compile_s)
    if program.fingerprint in known or program.executable is None:
        return TrialRecord(
            config, "duplicate", compile_s=program.compile_s, fingerprint=program.fingerprint
        )
    peak = program.memory.get("memory_peak_bytes")
    if max_memory is not None and peak is not None and peak > max_memory:
        record = TrialRecord(
            config,
            "over_memory",
            compile_s=program.compile_s,
            error=f"peak memory {peak:,} bytes is above the bound of {max_memory:,} bytes",
        )
    else:
        record = _run(spec, config, program, args, kwargs, oracle, policy, arg_sets, cache)
    record.fingerprint = program.fingerprint  # a failure too: its duplicates would fail alike
    for column, figure in program.memory.items():
        setattr(record, column, figure)
    return record


def _run(
    spec: KernelSpec,
    config: Config,
    program: Program,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    oracle: Any,
    policy: TimingPolicy,
    arg_sets: Sequence[Sequence[Any]],
    cache: dict[ConfigId, Any] | None,
) -> TrialRecord:
    """Run a compiled candidate once, verify it, then time it."""
    import jax

    compiled, compile_s = program.executable, program.compile_s
    start = time.perf_counter()
    try:
        output = jax.block_until_ready(compiled(*args))
    except Exception as e:
        return _run_failed(spec, config, args, kwargs, e, compile_s, start)
    verdict = compare(output, oracle, kwargs.get("precision"))
    if not verdict.ok:
        return TrialRecord(
            config,
            "rejected",
            compile_s=compile_s,
            run_s=time.perf_counter() - start,
            max_error=verdict.max_error,
            error=verdict.message,
        )
    try:
        timing = time_compiled(compiled, args, policy, arg_sets)
    except Exception as e:  # a kernel that ran once can still fail repeated, or on another set
        return _run_failed(spec, config, args, kwargs, e, compile_s, start, verdict.max_error)
    if cache is not None and len(cache) < MAX_CACHED:
        cache[config_id(config)] = compiled
    return TrialRecord(
        config,
        "ok",
        compile_s=compile_s,
        run_s=time.perf_counter() - start,
        max_error=verdict.max_error,
        **timing.as_trial_fields(),
    )


def _run_failed(
    spec: KernelSpec,
    config: Config,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    e: Exception,
    compile_s: float,
    start: float,
    max_error: float | None = None,
) -> TrialRecord:
    # an interpret mode keeps its simulated state after a kernel raised; the next candidate
    # needs it cleared (a no-op where none ran)
    backends.reset_interpret_state(spec.compiles_through(args, kwargs))
    return TrialRecord(
        config,
        "runtime_error",
        compile_s=compile_s,
        run_s=time.perf_counter() - start,
        max_error=max_error,
        error=one_line(e),
    )


def interleaved_samples(
    spec: KernelSpec,
    configs: Sequence[Config],
    sets: Sequence[Sequence[Any]],
    kwargs: Mapping[str, Any],
    rounds: int,
    reps: int,
    cache: Mapping[ConfigId, Any] | None = None,
    policy: TimingPolicy = DEFAULT_POLICY,
) -> tuple[list[list[float]], str]:
    """Samples of each config timed interleaved (see `interleaved`), on the input `sets`
    rotated as in the first measurement, and the timer that took them."""
    executables = []
    for config in configs:
        exe = (cache or {}).get(config_id(config))
        if exe is None:
            exe = compile_config(spec, config, sets[0], kwargs).executable
        executables.append(exe)
    return interleaved(executables, sets, rounds, reps, policy)


def one_line(e: BaseException) -> str:
    """An error as a trial's `error` text: its type and message, at most 2000 characters."""
    text = f"{type(e).__name__}: {e}"
    return text if len(text) <= 2000 else text[:2000] + " ..."


def timer_order(requested: str, platform: str) -> tuple[str, ...]:
    """The timers to try, best first: `requested` ("auto": the platform's, from its backends'
    facts), then the wall clock."""
    if requested == "auto":
        return backends.timers(platform)
    if requested not in TIMERS:
        raise ValueError(f"unknown timer {requested!r}: use auto or one of {', '.join(TIMERS)}")
    return (requested,) if requested == "wall" else (requested, "wall")


def time_compiled(
    compiled: Callable,
    args: Sequence[Any],
    policy: TimingPolicy = DEFAULT_POLICY,
    arg_sets: Sequence[Sequence[Any]] = (),
) -> Timing:
    """Time one call, repeated per `policy`, by the best timer available (`timer_order`). Calls
    rotate among `args` and `arg_sets` (copies of them: see `rotation_sets`)."""
    sets = [args, *arg_sets]
    order = timer_order(policy.timer, current_device().platform)
    _warm_up(compiled, sets, policy, device_timer=order[0] != "wall")
    for timer in order:
        samples = _samples(timer, compiled, sets, policy)
        if samples:
            _note_fallback(order[0], timer)
            return summarise(samples, timer)
    raise AssertionError("the wall clock always times")  # pragma: no cover


def interleaved(
    executables: Sequence[Callable],
    sets: Sequence[Sequence[Any]],
    rounds: int,
    reps: int,
    policy: TimingPolicy = DEFAULT_POLICY,
) -> tuple[list[list[float]], str]:
    """Samples of each executable, timed interleaved (A B C A B C ...) so that drift in the
    machine's state (clocks, temperature, neighbours) falls on every one alike; and the timer,
    the first of `timer_order` that times the first executable. Each is warmed up as a
    candidate is before it is timed alone (`time_compiled`): with a device timer first in
    line, for `policy.warmup_s` too (clocks ramp up), so that a side by side of a tuned
    kernel and another call (the vendor's, a group's member) favours neither."""
    order = timer_order(policy.timer, current_device().platform)
    for exe in executables:
        _warm_up(exe, sets, policy, device_timer=order[0] != "wall")
    timer = next(t for t in order if SAMPLERS[t](executables[0], sets, 0, 1))
    _note_fallback(order[0], timer)
    samples: list[list[float]] = [[] for _ in executables]
    for r in range(rounds):
        for exe, out in zip(executables, samples):
            out += SAMPLERS[timer](exe, sets, r * reps, reps)
    return samples, timer


def _warm_up(
    compiled: Callable, sets: Sequence[Sequence[Any]], policy: TimingPolicy, device_timer: bool
) -> None:
    import jax

    deadline = time.perf_counter() + (policy.warmup_s if device_timer else 0.0)
    calls = 0
    while calls < policy.warmup or time.perf_counter() < deadline:
        jax.block_until_ready(compiled(*sets[calls % len(sets)]))
        calls += 1


def _samples(
    timer: str, compiled: Callable, sets: Sequence[Sequence[Any]], policy: TimingPolicy
) -> list[float]:
    """Batches of `min_reps` samples until the spread target, `max_reps` or the time cap;
    [] where this timer has nothing to report here."""
    sampler = SAMPLERS[timer]
    samples: list[float] = []
    deadline = time.perf_counter() + policy.max_time_s
    while len(samples) < policy.max_reps:
        batch = sampler(
            compiled, sets, len(samples), min(policy.min_reps, policy.max_reps - len(samples))
        )
        if not batch:  # the batches already taken stand; none at all: the next timer times
            return samples
        samples += batch
        if time.perf_counter() > deadline or summarise(samples).spread <= policy.target_spread:
            break
    return samples


_fallbacks_noted: set[tuple[str, str]] = set()


def _note_fallback(wanted: str, used: str) -> None:
    if wanted != used and (wanted, used) not in _fallbacks_noted:
        _fallbacks_noted.add((wanted, used))
        log.warning("timer %r has nothing to report here: timing by %r instead", wanted, used)


# ---------------------------------------------------------------------------- the timers
# Each takes (compiled, sets, start, n): n calls, call i on sets[(start + i) % len(sets)], and
# returns each call's seconds, or [] where it has nothing to report.


def wall_samples(
    compiled: Callable, sets: Sequence[Sequence[Any]], start: int, n: int
) -> list[float]:
    """The host's clock around each synchronised call: dispatch and sync included."""
    import jax

    out = []
    for i in range(start, start + n):
        args = sets[i % len(sets)]
        begin = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        out.append(time.perf_counter() - begin)
    return out


def cupti_samples(
    compiled: Callable, sets: Sequence[Sequence[Any]], start: int, n: int
) -> list[float]:
    """Each call's kernels, summed, from CUPTI (through Mosaic GPU's extension: GPUs only). The
    n calls run back to back after one untimed call, rotating among the input sets as the other
    timers do (inputs that fit in the L2 are not re-read warm).

    Only set-up falls back ([]: no Mosaic GPU or CUPTI here, or calls whose kernels CUPTI cannot
    tell apart); a kernel that fails raises, as under every timer."""
    import jax

    ext = cupti_extension()
    if ext is None:
        return []
    jax.block_until_ready(compiled(*sets[start % len(sets)]))
    try:
        ext._cupti_init()
    except RuntimeError:  # CUPTI refused here (the set-up, never the kernel)
        return []
    try:
        outs = [compiled(*sets[(start + i) % len(sets)]) for i in range(n)]
        jax.block_until_ready(outs)
    finally:
        # a candidate takes several batches: CUPTI stays attached between them
        timings = ext._cupti_get_timings(False)
    return per_call_seconds(timings, n)


def cupti_extension() -> Any:
    """Mosaic GPU's extension, which reads CUPTI's kernel durations; None where it is absent."""
    try:
        from jax._src.lib import mosaic_gpu as mosaic_gpu_lib
    except ImportError:
        return None
    return getattr(mosaic_gpu_lib, "_mosaic_gpu_ext", None) if mosaic_gpu_lib else None


def per_call_seconds(timings: Sequence[tuple[str, float]], n: int) -> list[float]:
    """n calls' seconds from CUPTI's (kernel name, milliseconds) records, the calls' kernels in
    launch order; [] where they do not split into n calls of the same kernels."""
    if not timings or len(timings) % n:
        return []
    per = len(timings) // n
    calls = [timings[i * per : (i + 1) * per] for i in range(n)]
    if any([k for k, _ in c] != [k for k, _ in calls[0]] for c in calls):
        return []
    return [sum(ms for _, ms in c) * 1e-3 for c in calls]


def trace_samples(
    compiled: Callable, sets: Sequence[Sequence[Any]], start: int, n: int
) -> list[float]:
    """Each synchronised call's device time, read from a `jax.profiler` trace recorded in memory."""
    import jax

    try:  # the in-memory session is not public API; without it there is no trace timer
        from jax._src.lib import _profiler
    except ImportError:
        return []
    try:
        session = _profiler.ProfilerSession()
    except Exception:  # the profiler refused to start here: set-up, never the kernel
        return []
    try:
        for i in range(start, start + n):
            jax.block_until_ready(compiled(*sets[i % len(sets)]))
    finally:
        xspace = session.stop()
    return device_times_from_trace(xspace, n)


SAMPLERS: dict[str, Callable[..., list[float]]] = {
    "cupti": cupti_samples,
    "trace": trace_samples,
    "wall": wall_samples,
}

# Where a trace keeps device events: the plane of the first device, and on it either XLA's
# module line (TPU: one event per executed module) or the GPU's stream lines (one event per
# kernel launch or memset; the line names read "Stream #14(Compute)", "Stream #7(Memset,Compute)").
DEVICE_PLANE_PREFIXES = ("/device:TPU:", "/device:GPU:")
MODULE_LINE = "XLA Modules"
STREAM_LINE_MARK = "Compute"


def device_times_from_trace(xspace: bytes, n_calls: int) -> list[float]:
    """Per-call device seconds of the last `n_calls` synchronised calls recorded in a serialized
    `jax.profiler` XSpace ([] where it holds fewer device events than calls, e.g. on a CPU).

    On a GPU a call may launch several kernels: the calls were synchronised one by one, so the
    `n_calls - 1` widest gaps between consecutive events separate them, and a call's time is the
    sum of its events' durations (the kernels' time, not the host's gaps between them).
    """
    import jax

    data = jax.profiler.ProfileData.from_serialized_xspace(xspace)
    planes = sorted(
        (p for p in data.planes if p.name.startswith(DEVICE_PLANE_PREFIXES)), key=lambda p: p.name
    )
    if not planes or n_calls < 1:
        return []
    lines = list(planes[0].lines)  # a worker owns one device: its first plane
    modules = [line for line in lines if line.name == MODULE_LINE]
    if modules:
        times = [e.duration_ns * 1e-9 for e in modules[0].events]
        return times[-n_calls:] if len(times) >= n_calls else []
    events = sorted(
        (e.start_ns, e.duration_ns)
        for line in lines
        if STREAM_LINE_MARK in line.name
        for e in line.events
    )
    if len(events) < n_calls:
        return []
    gaps = sorted(
        range(1, len(events)),
        key=lambda i: events[i][0] - sum(events[i - 1]),
        reverse=True,
    )
    bounds = [0, *sorted(gaps[: n_calls - 1]), len(events)]
    return [sum(d for _, d in events[a:b]) * 1e-9 for a, b in zip(bounds, bounds[1:])]


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


def cache_bytes(device: DeviceInfo) -> int:
    """The cache that could flatter a repeated call's inputs: the GPU's L2. TPUs stream inputs
    from HBM into VMEM on every call, and on the CPU (interpret mode) figures are never served,
    so neither rotates."""
    return backends.of_platform(device.platform).cache_bytes(device.device_kind)
