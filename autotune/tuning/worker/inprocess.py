"""Measuring candidates in this process: no isolation, no start-up cost (interactive use; and,
inside a device worker's child, the measuring itself)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

from autotune.device import current_device
from autotune.measure.compile_pool import CompilePool, default_compile_workers
from autotune.measure.compiling import compile_config
from autotune.measure.timing import (
    DEFAULT_POLICY,
    TimingPolicy,
    cache_bytes,
    interleaved_samples,
    measure_candidate,
    rotation_sets,
)
from autotune.registry.spec import KernelSpec
from autotune.trial import Config, ConfigId, TrialRecord
from autotune.tuning.task import Task


class InProcessWorker:
    """Measures candidates of `spec` for `task` with the inputs `args`, in this process, on the
    device it runs on.

    The candidates the search will measure next (`prefetch`) compile in a `CompilePool` of
    `compile_workers` threads while the current one is timed (None: sized to the host, see
    `default_compile_workers`).
    """

    def __init__(
        self,
        spec: KernelSpec,
        task: Task,
        args: Sequence[Any],
        policy: TimingPolicy = DEFAULT_POLICY,
        compile_workers: int | None = None,
    ) -> None:
        self.spec, self.args, self.kwargs = spec, list(args), task.static_dict
        self.oracle: Any = None
        self.policy = policy
        self.device = current_device()
        self.device_id = f"{self.device.platform}:0"  # this process's default device
        self.arg_sets = rotation_sets(self.args, cache_bytes(self.device))
        self.compiled: dict[ConfigId, Any] = {}  # verified executables by config_id, for finalists
        self.restarts = 0
        # the fingerprints of programs measured already: a compile, ahead or not, skips them
        self.known: frozenset[str] = frozenset()
        if compile_workers is None:
            compile_workers = default_compile_workers(self.device)
        self.pool = CompilePool(
            compile_workers,
            lambda c: compile_config(self.spec, c, self.args, self.kwargs, self.known),
        )

    def set_oracle(self, oracle: Any) -> None:
        """The output every candidate must match."""
        self.oracle = oracle

    def prefetch(self, configs: Sequence[Config]) -> None:
        """Compile these, the configs measured after the next one, ahead."""
        self.pool.prefetch(configs)

    def measure(
        self,
        config: Config,
        known: Collection[str] = (),
        max_memory: int | None = None,
        on_compiled: Callable[[float], None] | None = None,
    ) -> TrialRecord:
        """One candidate's trial record (a `duplicate` if its program's fingerprint is `known`,
        `over_memory` if its peak memory is above `max_memory` bytes); `on_compiled` hears its
        compile time before it runs."""
        self.known = frozenset(known)
        return measure_candidate(
            self.spec,
            config,
            self.args,
            self.kwargs,
            self.oracle,
            self.policy,
            on_compiled=on_compiled,
            arg_sets=self.arg_sets,
            cache=self.compiled,
            pool=self.pool,
            known=self.known,
            max_memory=max_memory,
        )

    def interleaved(
        self, configs: Sequence[Config], rounds: int, reps: int
    ) -> tuple[list[list[float]], str]:
        """Interleaved samples of configs that measured fine before, and their timer."""
        return interleaved_samples(
            self.spec,
            configs,
            [self.args, *self.arg_sets],
            self.kwargs,
            rounds,
            reps,
            self.compiled,
            self.policy,
        )

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> InProcessWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
