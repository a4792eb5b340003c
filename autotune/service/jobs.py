"""Running a job: a list of tuning tasks (from a job file or recorded misses), sharded across
machines, each tuned in turn with its progress reported. A task already tuned for the device
kind and kernel version is skipped (unless forced), and a task's search is an Optuna study in a
storage, so running an interrupted job again resumes it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from autotune.device import DeviceInfo, warn_shared_cores
from autotune.errors import AutotuneError, JobError
from autotune.service.progress import JobProgress, Outcome
from autotune.tuning.settings import DEFAULTS, TuneSettings
from autotune.tuning.task import BoundTask, Task

if TYPE_CHECKING:
    from autotune.db import TuningDB

log = logging.getLogger(__name__)


def shard(tasks: Sequence[Task], index: int, count: int) -> list[Task]:
    """Every count-th task from `index`: the shards of one task list are disjoint, cover it, and
    are the same on every machine that reads the same job file."""
    return [t for k, t in enumerate(tasks) if k % count == index]


def run_tasks(
    tasks: Sequence[Task | BoundTask],
    device: DeviceInfo | None,
    *,
    db: TuningDB,
    settings: TuneSettings = DEFAULTS,
    force: bool = False,
    retune: bool = False,
    forget: bool = False,
    show: Callable[[JobProgress, Outcome | None], None] | None = None,
) -> list[Outcome]:
    """Tune each task in order on `device` (see tuning_device) or, where `settings.devices`
    names several and the tasks are at least as many, side by side, each task on one of the
    devices (fewer tasks run in turn, each on every device); those `db` (a TuningDB its
    caller opened) already has an entry for are skipped unless `force` (which tunes them in
    fresh studies) or `retune` (which resumes their studies: the command line's single task,
    tuned whether or not it was); `forget` deletes each task's studies once it is tuned (the
    next run tunes afresh).

    Each task is handed down once, to autotune.tuning.tune.tune_job_task, which binds it to
    the device it is measured on. Where nothing is skipped `device` may be None: under
    isolation on one device, a task is then bound to the device of the worker started for it.

    Each task is tuned with `settings`, its own budget, strategy and seed (Task.settings), and
    the study of its key in `settings.storage`.

    A task that fails (no valid configuration, a kernel error) is reported and the job goes on.
    """
    if device is None and not retune:
        raise JobError("run_tasks: give the device the tasks are checked on, or retune=True")
    job = _Job(tasks, device, db, settings, show, force=force, retune=retune, forget=forget)
    spread = _spread_over(tasks, device, settings)
    if spread > 1:
        return job.spread(spread)
    trials = [_plain(t).trials for t in tasks]
    progress = JobProgress(n_tasks=len(tasks), budget_left=sum(trials))
    outcomes = []
    for i, task in enumerate(tasks, 1):
        progress.budget_left -= trials[i - 1]
        outcomes.append(job.run(i, task, progress))
    return outcomes


def _spread_over(
    tasks: Sequence[Task | BoundTask], device: DeviceInfo | None, settings: TuneSettings
) -> int:
    """On how many devices a job runs its tasks side by side, one device each: all it has where
    the tasks are at least as many (1: the tasks run in turn, each on every device)."""
    if settings.devices == 1 or device is None or len(tasks) < 2:
        return 1
    from autotune.tuning.worker import device_count

    n = device_count(settings)
    return n if len(tasks) >= n else 1


class _Job:
    """Running a job's tasks: one at a time (`run`), or side by side on several devices, each
    task on one (`spread`)."""

    def __init__(
        self,
        tasks: Sequence[Task | BoundTask],
        device: DeviceInfo | None,
        db: TuningDB,
        settings: TuneSettings,
        show: Callable[[JobProgress, Outcome | None], None] | None,
        **redo: bool,
    ) -> None:
        self.tasks, self.device, self.db, self.settings = tasks, device, db, settings
        self.show = show
        self.redo = redo  # force, retune, forget: see run_tasks
        self.showing = threading.Lock()  # one display, for every device's tasks
        self.stop = threading.Event()  # an interrupt: the devices end after their trial

    def run(
        self, i: int, task: Task | BoundTask, progress: JobProgress, worker: Any = None
    ) -> Outcome:
        """Task `i` tuned (with `worker`, a DeviceWorker, where given), its outcome shown."""
        progress.task_index, progress.task = i, _plain(task)
        progress.trial, progress.n_trials, progress.best_s = 0, _plain(task).trials, None
        progress.duplicates = 0
        outcome = self._tuned(task, progress, worker)
        self._show(progress, outcome)
        return outcome

    def spread(self, n: int) -> list[Outcome]:
        """The tasks side by side on `n` devices: a device worker pinned to each, started for
        its first task and kept for its next, takes the next task as it finishes one."""
        from autotune.tuning.worker import task_device_worker

        waiting = list(enumerate(self.tasks, 1))
        outcomes: dict[int, Outcome] = {}
        if self.device is not None:
            warn_shared_cores(self.device.platform, n)

        def lane(index: int) -> None:
            progress = JobProgress(n_tasks=len(self.tasks))
            with contextlib.ExitStack() as stack:
                worker = None
                while not self.stop.is_set():
                    with self.showing:
                        if not waiting:
                            return
                        i, task = waiting.pop(0)
                    if worker is None:
                        try:
                            started = task_device_worker(_plain(task), self.settings, index)
                            worker = stack.enter_context(started)
                        except (AutotuneError, TypeError) as e:  # this task fails, as alone
                            progress.task_index, progress.task = i, _plain(task)
                            outcomes[i] = Outcome(_plain(task), "failed", str(e))
                            self._show(progress, outcomes[i])
                            continue
                    outcomes[i] = self.run(i, task, progress, worker)

        with ThreadPoolExecutor(n) as pool:
            lanes = [pool.submit(lane, index) for index in range(n)]
            try:
                for future in lanes:
                    future.result()
            except BaseException:
                self.stop.set()  # the others end after the trial they measure
                raise
        return [outcomes[i] for i in sorted(outcomes)]

    def _show(self, progress: JobProgress, outcome: Outcome | None) -> None:
        if self.show:
            with self.showing:
                self.show(progress, outcome)

    def _tuned(self, given: Task | BoundTask, progress: JobProgress, worker: Any) -> Outcome:
        from autotune.tuning.context import TuneContext
        from autotune.tuning.tune import tune_job_task

        task = _plain(given)

        def on_trial(record: Any, j: int, n: int) -> None:
            if self.stop.is_set():  # another device's task was interrupted
                raise KeyboardInterrupt
            progress.trial, progress.n_trials, progress.record = j, n, record
            progress.trials_done += 1
            progress.duplicates += record.status == "duplicate"
            if record.time_s is not None and record.status == "ok":
                best = progress.best_s
                progress.best_s = min(best, record.time_s) if best else record.time_s
            self._show(progress, None)

        context = TuneContext(self.settings, self.db, progress=on_trial, worker=worker)
        try:
            result = tune_job_task(given, self.device, context, **self.redo)
        except TypeError as e:  # the kernel's own signature refused the arguments
            return Outcome(task, "failed", f"the kernel refused these arguments: {e}")
        except AutotuneError as e:
            return Outcome(task, "failed", str(e))
        if result is None:
            progress.n_trials = 0
            return Outcome(task, "skipped", "already tuned for this device kind")
        progress.best_s = result.best_time_s
        return Outcome(task, "tuned", result.summary, result)


def _plain(task: Task | BoundTask) -> Task:
    return task.task if isinstance(task, BoundTask) else task
