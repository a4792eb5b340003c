"""Measuring candidates: in this process, or in a device worker process that may die.

Both workers implement `Worker`, so the tuner and the finalists never ask which one they have:

- `InProcessWorker` (inprocess.py) measures in this process, without isolation: interactive use
  (`tune()`'s default).
- `DeviceWorker` (parent.py) measures in a child process that owns the device (child.py; the
  two speak protocol.py): a candidate that crashes or hangs it becomes a `crashed` / `timeout`
  trial under `WorkerLimits`, and a fresh child takes the next one.

Either compiles the candidates the search will measure next (`prefetch`) in threads while the
current one is timed (autotune.measure.compile_pool). Which one measures a task is chosen here
(`task_worker`), from the run's settings, for the tuner and a group's tuning alike.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol

from autotune.device import DeviceInfo, warn_shared_cores
from autotune.measure.policies import DEFAULT_LIMITS, WorkerLimits
from autotune.registry.spec import KernelSpec
from autotune.trial import Config, TrialRecord
from autotune.tuning.task import Task
from autotune.tuning.worker.inprocess import InProcessWorker
from autotune.tuning.worker.parent import DeviceWorker, device_count

if TYPE_CHECKING:
    from autotune.tuning.settings import TuneSettings


class Worker(Protocol):
    """What measures a tuning task's candidates, on `device`."""

    device: DeviceInfo
    device_id: str  # the local device its trials record: "gpu:3"
    restarts: int  # fresh processes started after a crash or timeout (0 in process)

    def set_oracle(self, oracle: Any) -> None:
        """The output every candidate must match (autotune.measure.oracle), before the first measure."""

    def prefetch(self, configs: Sequence[Config]) -> None:
        """Compile these, the configs measured after the next one, ahead."""

    def measure(
        self, config: Config, known: Collection[str] = (), max_memory: int | None = None
    ) -> TrialRecord:
        """Compile, run, verify and time one candidate; a failure is the record's status. One
        whose program's fingerprint is `known` (measured already) is a `duplicate`, one whose
        peak memory is above `max_memory` bytes `over_memory`: neither is run."""

    def interleaved(
        self, configs: Sequence[Config], rounds: int, reps: int
    ) -> tuple[list[list[float]], str] | None:
        """Samples of configs that measured fine, timed interleaved, and the timer that took
        them; None where the worker could not (the caller keeps the first figures)."""

    def close(self) -> None: ...

    def __enter__(self) -> Worker: ...

    def __exit__(self, *exc: object) -> None: ...


def device_worker(
    task: Task, args: Sequence[Any], settings: TuneSettings, device_index: int | None = None
) -> DeviceWorker:
    """A device worker process for `task`, with the settings' timing, limits and platforms,
    pinned to local device `device_index` where given."""
    return DeviceWorker(
        task,
        args,
        settings.policy,
        settings.limits,
        settings.worker_platforms,
        settings.compile_workers,
        device_index,
    )


def task_device_worker(
    task: Task, settings: TuneSettings, device_index: int | None = None
) -> DeviceWorker:
    """A device worker started for `task` before a tuner has it, to be lent, pinned to local
    device `device_index` where given: a job's, started to tell where the task is measured, or
    kept for its next tasks; a variant group's, for its members and their side by side. It
    imports the task's kernel, and has no inputs yet: each tuner it is lent to sets it to its
    task with the inputs it is measured on, made once (task_worker; BoundTask.measured)."""
    return device_worker(task, (), settings, device_index)


@contextlib.contextmanager
def task_workers(
    spec: KernelSpec,
    task: Task,
    args: Sequence[Any],
    settings: TuneSettings,
    given: DeviceWorker | None = None,
) -> Iterator[list[Worker]]:
    """The workers that measure `task`'s candidates: `task_worker`'s one, or where the
    settings ask for several devices, a device worker pinned to each (started together),
    all stopped when the context ends."""
    n = 1 if given is not None else device_count(settings)
    if n == 1:
        with task_worker(spec, task, args, settings, given) as worker:
            yield [worker]
        return
    with ThreadPoolExecutor(n) as pool:
        starting = [pool.submit(device_worker, task, args, settings, i) for i in range(n)]
    with contextlib.ExitStack() as stack:
        for future in starting:  # every started worker is stopped, whichever failed to start
            if future.exception() is None:
                stack.enter_context(future.result())
        workers = [future.result() for future in starting]
        warn_shared_cores(workers[0].device.platform, n)
        yield workers


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
    under the settings' isolation (pinned to the first device where they name several), or
    one in this process; either stopped when the context ends."""
    if given is not None:
        given.device = given.set_task(task, args, settings.policy)
        yield given
        return
    if settings.isolate or settings.devices != 1:
        worker: Any = device_worker(task, args, settings, None if settings.devices == 1 else 0)
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
    "device_count",
    "device_worker",
    "task_worker",
    "task_workers",
]
