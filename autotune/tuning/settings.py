"""The settings of one tuning run, shared by `autotune.tune`, the CLI and job files.

A module apart from autotune.runtime.settings: those are the runtime's, read from the environment once
per process and imported on the model's call path; these are chosen per tuning run, by a caller.
Every value is checked here, whoever sets it; a front end that spells a field differently
(`--trials`, a job file's `trials`) words the refusal with its own name (SettingsError.naming).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autotune.errors import SettingsError
from autotune.measure.policies import DEFAULT_LIMITS, DEFAULT_POLICY, TimingPolicy, WorkerLimits
from autotune.search.strategies import DEFAULT_STRATEGY, STRATEGIES

MAX_SEED = 2**32 - 1  # the samplers' seeds are unsigned 32-bit


@dataclass(frozen=True)
class TuneSettings:
    """How one tuning task searches, measures and decides. Every field has a default.

    The search stops at whichever budget runs out first: `n_trials`, `time_limit_s`,
    `patience`.
    """

    n_trials: int = 32
    """The most distinct programs measured (a whole number, at least 1): a configuration that
    compiles to a program measured already is stored as its `duplicate`, not measured, and
    costs none (as many in a row end the search). With a `storage`, the budget of the whole
    study, shared by every worker that joins it."""

    strategy: str = DEFAULT_STRATEGY
    """How the search proposes configurations: one of autotune.search.strategies.STRATEGIES ("gp",
    the default, "tpe", "cmaes", "random", "grid")."""

    seed: int | None = None
    """The search's random seed (0 to 2^32 - 1; it also seeds the random inputs); None: not
    seeded, and inputs from seed 0. A seeded run repeats exactly."""

    time_limit_s: float | None = None
    """Seconds of wall time after which the search stops (positive); None: no limit."""

    patience: int | None = None
    """Stop after this many trials in a row without a 1% improvement (at least 1); None: never."""

    warm_start: bool = True
    """Measure the default and the best configurations stored for this kernel and device at the
    nearest shapes before sampling."""

    transfer: bool = True
    """Give the search what other device kinds measured of this kernel (same version and
    platform; the database's trials, the shipped table's entries): their best configurations
    measured first, their times the model's prior, trusted as far as they agree with this
    device's (autotune.search.transfer). False: the search knows only this device's."""

    finalists: int = 3
    """The fastest candidates re-measured interleaved with the default before the winner is
    chosen (0 or more; 0: the fastest first measurement wins)."""

    policy: TimingPolicy = DEFAULT_POLICY
    """How long each candidate is timed: warm-up, repetitions, timer (autotune.measure.timing)."""

    isolate: bool = False
    """Measure in a device worker process, so that a candidate that crashes or hangs becomes a
    `crashed` or `timeout` trial instead of ending the run (autotune.tuning.worker). The CLI's default
    is True; tune()'s is False."""

    limits: WorkerLimits = DEFAULT_LIMITS
    """A device worker's per-candidate time limits, in seconds: `compile_s` to compile one,
    `run_s` to verify and time it (both positive), `start_s` to start the worker."""

    worker_platforms: str | None = None
    """JAX_PLATFORMS for a device worker, so that this process can keep to the CPU (the CLI
    does); None: the worker inherits this process's."""

    compile_workers: int | None = None
    """Threads compiling the candidates queued next while the current one is timed (0 or more);
    None sizes them to the host: up to 4 on an accelerator, none on the CPU, where they would
    disturb timing. A worker passed to tune() keeps its own."""

    devices: int | str = 1
    """How many local devices measure at once (a whole number, at least 1, or "all"): each a
    device worker pinned to its own device, sharing the task's `n_trials` through one study;
    more than one implies `isolate`. The finalists are re-measured side by side on the first."""

    storage: str | None = None
    """An Optuna RDB URL in which the search is a study: an interrupted run resumes without
    measuring again, and several workers share `n_trials`. None: the study is in memory."""

    max_memory: int | None = None
    """The most bytes of peak memory a candidate's program may need, by the compiler's memory
    analysis (where the backend reports it: CPU and GPU do): one above it is an `over_memory`
    trial, compiled but never run. None: no bound."""

    study_name: str | None = None
    """The study's name in `storage`; None: derived from the tuning key, so that workers tuning
    the same key meet in one study (autotune.search.studies.study_name_of)."""

    workload: str | None = None
    """Which of the kernel's workloads makes its integer arguments that are data (group sizes,
    sequence lengths, page tables: autotune.measure.inputs.task_inputs); None: its first. Each
    trial records it."""

    def __post_init__(self) -> None:
        # in the order the CLI has always checked its flags
        _at_least(self.n_trials, "n_trials", 1, "at least 1")
        if self.strategy not in STRATEGIES:
            raise SettingsError(
                "strategy", f"must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}"
            )
        _seconds(self.limits.compile_s, "limits.compile_s")
        _seconds(self.limits.run_s, "limits.run_s")
        if self.time_limit_s is not None:
            _seconds(self.time_limit_s, "time_limit_s")
        if self.patience is not None:
            _at_least(self.patience, "patience", 1, "at least 1 trial")
        if self.seed is not None and not (_is_whole(self.seed) and 0 <= self.seed <= MAX_SEED):
            raise SettingsError(
                "seed", f"must be a whole number from 0 to {MAX_SEED}, got {self.seed!r}"
            )
        if not isinstance(self.transfer, bool):
            raise SettingsError("transfer", f"must be true or false, got {self.transfer!r}")
        _at_least(self.finalists, "finalists", 0, "0 or more")
        if self.compile_workers is not None:
            _at_least(self.compile_workers, "compile_workers", 0, "0 or more")
        if self.max_memory is not None:
            _at_least(self.max_memory, "max_memory", 1, "a positive number of bytes")
        if self.workload is not None and not (isinstance(self.workload, str) and self.workload):
            raise SettingsError("workload", f"must be a workload's name, got {self.workload!r}")
        if self.devices != "all":
            _at_least(self.devices, "devices", 1, 'at least 1, or "all"')

    def replace(self, **changes: Any) -> TuneSettings:
        """These settings with `changes` (field names), checked; an unknown name is a
        TypeError that lists the fields."""
        unknown = sorted(set(changes) - set(FIELDS))
        if unknown:
            close = [m for name in unknown for m in difflib.get_close_matches(name, FIELDS, 1)]
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise TypeError(
                f"unknown tuning setting(s) {', '.join(unknown)}: the settings are "
                f"{', '.join(FIELDS)}{hint}"
            )
        return dataclasses.replace(self, **changes)


FIELDS = tuple(f.name for f in dataclasses.fields(TuneSettings))


def _is_whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _at_least(value: Any, name: str, least: int, wording: str) -> None:
    if not _is_whole(value):
        raise SettingsError(name, f"must be a whole number, got {value!r}")
    if value < least:
        raise SettingsError(name, f"must be {wording}, got {value}")


def _seconds(value: Any, name: str) -> None:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and value > 0):
        raise SettingsError(name, f"must be a positive number of seconds, got {value}")


def checked(names: Mapping[str, str], **values: Any) -> TuneSettings:
    """TuneSettings(**values), a refusal naming the field as the caller spells it (`names`,
    e.g. {"n_trials": "--trials"})."""
    try:
        return TuneSettings(**values)
    except SettingsError as e:
        raise e.naming(names) from None


DEFAULTS = TuneSettings()  # below the checks its construction runs
