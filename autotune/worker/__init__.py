"""Measuring candidates: in this process, or in a device worker process that may die.

Both workers implement `Worker`, so the tuner and the finalists never ask which one they have:

- `InProcessWorker` (inprocess.py) measures in this process, without isolation: interactive use
  (`tune()`'s default).
- `DeviceWorker` (parent.py) measures in a child process that owns the device (child.py; the
  two speak protocol.py): a candidate that crashes or hangs it becomes a `crashed` / `timeout`
  trial under `WorkerLimits`, and a fresh child takes the next one.

Either compiles the candidates the search will measure next (`prefetch`) in threads while the
current one is timed (autotune.compile_pool). Which one measures a task is chosen here
(`task_worker`), from the run's settings, for the tuner and a group's tuning alike.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from autotune.device import DeviceInfo
from autotune.policies import DEFAULT_LIMITS, WorkerLimits
from autotune.registry import KernelSpec
from autotune.task import Task
from autotune.trial import Config, TrialRecord
from autotune.worker.inprocess import InProcessWorker
from autotune.worker.parent import DeviceWorker

if TYPE_CHECKING:
    from autotune.tune_settings import TuneSettings


class Worker(Protocol):
    """What measures a tuning task's candidates, on `device`."""

    device: DeviceInfo
    restarts: int  # fresh processes started after a crash or timeout (0 in process)

    def set_oracle(self, oracle: Any) -> None:
        """The output every candidate must match (autotune.oracle), before the first measure."""

    def prefetch(self, configs: Sequence[Config]) -> None:
        """Compile these, the configs measured after the next one, ahead."""

    def measure(self, config: Config, known: Collection[str] = ()) -> TrialRecord:
        """Compile, run, verify and time one candidate; a failure is the record's status. One
        whose program's fingerprint is `known` (measured already) is a `duplicate`, not run."""

    def interleaved(
        self, configs: Sequence[Config], rounds: int, reps: int
    ) -> tuple[list[list[float]], str] | None:
        """Samples of configs that measured fine, timed interleaved, and the timer that took
        them; None where the worker could not (the caller keeps the first figures)."""

    def close(self) -> None: ...

    def __enter__(self) -> Worker: ...

    def __exit__(self, *exc: object) -> None: ...


def device_worker(task: Task, args: Sequence[Any], settings: TuneSettings) -> DeviceWorker:
    """A device worker process for `task`, with the settings' timing, limits and platforms."""
    return DeviceWorker(
        task,
        args,
        settings.policy,
        settings.limits,
        settings.worker_platforms,
        settings.compile_workers,
    )


@contextlib.contextmanager
def task_worker(
    spec: KernelSpec,
    task: Task,
    args: Sequence[Any],
    settings: TuneSettings,
    given: DeviceWorker | None = None,
) -> Iterator[Worker]:
    """The worker that measures `task`'s candidates (of `spec`, on `args`): `given`, set to
    this task and left running after (many tasks share its start-up); else a device worker
    under the settings' isolation, or one in this process; either stopped when the context
    ends."""
    if given is not None:
        given.device = given.set_task(task, args, settings.policy)
        yield given
        return
    if settings.isolate:
        worker: Any = device_worker(task, args, settings)
    else:
        worker = InProcessWorker(spec, task, args, settings.policy, settings.compile_workers)
    with worker:
        yield worker


__all__ = [
    "DEFAULT_LIMITS",
    "DeviceWorker",
    "InProcessWorker",
    "Worker",
    "WorkerLimits",
    "device_worker",
    "task_worker",
]
