"""Running a job: a list of tuning tasks (from a job file or recorded misses), sharded across
machines, each tuned in turn with its progress reported. A task already tuned for the device
kind and kernel version is skipped (unless forced), and a task's search is an Optuna study in a
storage, so running an interrupted job again resumes it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from autotune.device import DeviceInfo
from autotune.errors import AutotuneError, JobError
from autotune.progress import JobProgress, Outcome
from autotune.signature import TuningKey
from autotune.storing import open_db
from autotune.task import Task, bind
from autotune.trial import config_text
from autotune.tune_settings import DEFAULTS, TuneSettings

log = logging.getLogger(__name__)


def parse_shard(text: str) -> tuple[int, int]:
    """'2/4' -> (2, 4): shard indices run from 0 to N-1 (a Kubernetes JOB_COMPLETION_INDEX)."""
    i, sep, n = text.partition("/")
    if not sep or not i.isdigit() or not n.isdigit() or int(n) < 1 or int(i) >= int(n):
        raise JobError(f"malformed --shard {text!r}: write i/N with 0 <= i < N, e.g. 0/4")
    return int(i), int(n)


def shard(tasks: Sequence[Task], index: int, count: int) -> list[Task]:
    """Every count-th task from `index`: the shards of one task list are disjoint, cover it, and
    are the same on every machine that reads the same job file."""
    return [t for k, t in enumerate(tasks) if k % count == index]


def run_tasks(
    tasks: Sequence[Task],
    device: DeviceInfo | None,
    *,
    db: Any = None,
    settings: TuneSettings = DEFAULTS,
    force: bool = False,
    retune: bool = False,
    show: Callable[[JobProgress, Outcome | None], None] | None = None,
) -> list[Outcome]:
    """Tune each task in order on `device` (see tuning_device); those it already has an entry
    for are skipped unless `force` (which tunes them in fresh studies) or `retune` (which
    resumes their studies: the command line's single task, tuned whether or not it was).
    Where nothing is skipped `device` may be None: each task is bound to the device its worker
    measures on.

    Each task is tuned with `settings`, its own budget, strategy and seed (Task.settings), and
    the study of its key in `settings.storage`.

    A task that fails (no valid configuration, a kernel error) is reported and the job goes on.
    """
    from autotune.studies import delete_study, study_name_of
    from autotune.tuning import tune_task

    if device is None and not retune:
        raise JobError("run_tasks: give the device the tasks are checked on, or retune=True")
    handle = open_db(db)
    progress = JobProgress(n_tasks=len(tasks), budget_left=sum(t.trials for t in tasks))
    outcomes = []
    try:
        for i, task in enumerate(tasks, 1):
            progress.task_index, progress.task = i, task
            progress.trial, progress.n_trials, progress.best_s = 0, task.trials, None
            progress.budget_left -= task.trials
            try:
                bound = bind(task, device) if device is not None else task
                if not (force or retune) and handle.best(bound.key) is not None:
                    outcome = Outcome(task, "skipped", "already tuned for this device kind")
                    progress.n_trials = 0
                else:
                    if force and settings.storage:
                        for old in (bound.key, *_member_keys(bound)):
                            delete_study(settings.storage, study_name_of(old))

                    def on_trial(record: Any, j: int, n: int) -> None:
                        progress.trial, progress.n_trials, progress.record = j, n, record
                        progress.trials_done += 1
                        if record.time_s is not None and record.status == "ok":
                            best = progress.best_s
                            progress.best_s = min(best, record.time_s) if best else record.time_s
                        if show:
                            show(progress, None)

                    # each task in the study of its own key (autotune.studies.study_name_of)
                    run = settings.replace(study_name=None)
                    result = tune_task(bound, run, db=handle, progress=on_trial)
                    progress.best_s = result.best_time_s
                    outcome = Outcome(task, "tuned", _summary(result), result)
            except TypeError as e:  # the kernel's own signature refused the arguments
                outcome = Outcome(task, "failed", f"the kernel refused these arguments: {e}")
            except AutotuneError as e:
                outcome = Outcome(task, "failed", str(e))
            outcomes.append(outcome)
            if show:
                show(progress, outcome)
    finally:
        if handle is not db:
            handle.close()
    return outcomes


def _member_keys(bound: Any) -> list[TuningKey]:
    """A variant group's members' keys (each member is tuned in a study of its own key)."""
    from autotune.variants import VariantGroup

    if not isinstance(bound.kernel, VariantGroup):
        return []
    return bound.kernel.member_keys(bound.args, bound.task.static_dict, bound.device)


def _summary(result: Any) -> str:
    config = config_text(result.best_config)
    speedup = f"{result.speedup:.2f}x" if result.speedup else "n/a"
    resumed = f" ({resumed_text(result)})" if result.resumed else ""
    first = ", first-pass figures" if result.first_pass else ""
    first += ", within the noise" if result.within_noise else ""
    return f"{config} {result.best_time_s * 1e3:.4f} ms, speedup {speedup}, {len(result.trials)} trials{resumed}{first}"


def resumed_text(result: Any) -> str:
    """'4 of 10 trials already measured': what a resumed study did not measure again."""
    return f"{result.resumed} of {len(result.trials)} trials already measured"
