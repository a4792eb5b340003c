"""Tuning, the public entry: `tune` (a call), `tune_task` (a bound task) and `tune_job_task` (a
task as a job hands it down: bound here once, skipped where tuned already).

All come to `tune_task`, which alone chooses between a kernel (autotune.tuning.kernel) and a variant
group (autotune.tuning.group, which tunes each member through the tuner), both below it, and
hands either the task as bound and one TuneContext (autotune.tuning.context).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from autotune.device import DeviceInfo, current_device
from autotune.errors import SignatureError
from autotune.runtime.variants import VariantGroup
from autotune.signature import is_array
from autotune.trial import TrialRecord
from autotune.tuning.context import TuneContext
from autotune.tuning.group import tune_group
from autotune.tuning.kernel import tune_kernel
from autotune.tuning.result import TuneResult
from autotune.tuning.settings import TuneSettings
from autotune.tuning.storing import open_db
from autotune.tuning.task import BoundTask, Task, bind, kernel_of, task_of_call
from autotune.tuning.worker import DeviceWorker, task_device_worker


def tune(
    fn: Any,
    args: Sequence[Any],
    *,
    kwargs: Mapping[str, Any] | None = None,
    settings: TuneSettings | None = None,
    db: Any = None,
    store: bool = True,
    progress: Callable[[TrialRecord, int, int], None] | None = None,
    worker: DeviceWorker | None = None,
    **overrides: Any,
) -> TuneResult:
    """Tune `fn` (an autotuned kernel, a registered name or 'pkg.module:fn') for these arguments
    (arrays or jax.ShapeDtypeStruct; static arguments in `kwargs`).

    Every candidate is compiled ahead of time, checked against the oracle (autotune.measure.oracle) and
    timed; the best verified one is stored in `db` (a TuningDB, URL or path; default: the
    per-user database) with every trial, unless `store` is False. `progress` is called after
    each trial with it, its number and the budget.

    How it searches, measures and decides is `settings` (a TuneSettings; default: its
    defaults), with `overrides` given by field name: `tune(kernel, args, n_trials=8)`. A
    `worker` given (a DeviceWorker) is used and left running, so that many tuning tasks share
    one start-up; it implies isolation.
    """
    settings = (settings or TuneSettings()).replace(**overrides)
    if is_array(args):
        raise SignatureError(
            "tune() takes the kernel's arguments as a list: write tune(kernel, [x, ...]), "
            "not tune(kernel, x)"
        )
    kernel = kernel_of(fn)
    task = task_of_call(fn, args, kwargs, settings)
    # a call is tuned where it is made: bound to this process's device, as its workers' is
    bound = bind(task, current_device(), kernel, args)
    return tune_task(bound, TuneContext(settings, db, store, progress, worker))


def tune_task(bound: BoundTask, context: TuneContext) -> TuneResult:
    """Tune a task bound to the device its workers measure on (autotune.tuning.task: from the
    command line, a job file, a recorded miss, a program's call or `tune`) on random inputs of
    its shapes and dtypes, with the context's settings and the task's own budget, strategy and
    seed. The inputs are made here, once (BoundTask.measured), and the database opened once
    where the run stores (closed after, unless given open)."""
    settings = bound.task.settings(context.settings)
    measured = bound.measured(settings)
    db = open_db(context.db) if context.store else context.db
    try:
        run = context.replace(settings=settings, db=db)
        if isinstance(bound.kernel, VariantGroup):
            return tune_group(measured, run)
        return tune_kernel(measured, run)
    finally:
        if db is not context.db:
            db.close()


def tune_job_task(
    task: Task | BoundTask,
    device: DeviceInfo | None,
    context: TuneContext,
    *,
    force: bool = False,
    retune: bool = False,
    forget: bool = False,
) -> TuneResult | None:
    """Tune a job's `task`, bound once, here, to the device it is measured on: `device`, else
    the context's worker's; else, under isolation on one device, that of a device worker
    started here for it and lent to the tuner (this process may keep to another platform than
    its workers, and only they can tell theirs); else tuning_device's. A task given bound there
    already (a watcher binds a miss to claim its key) is taken as it is.

    None where its key has an entry already, unless `force` (a fresh search: TuneContext.fresh)
    or `retune` (its study resumed). `forget` deletes its studies once it is tuned, unless
    another worker searches them, so that the next run tunes afresh (TuneContext.forget). Its
    own study is its key's (autotune.search.studies.study_name_of), a variant group's members'
    each their own key's, in `context.db` (a TuningDB) and the settings' storage."""
    from autotune.tuning.worker.parent import tuning_device

    settings, worker = context.settings, context.worker
    plain = task.task if isinstance(task, BoundTask) else task
    with contextlib.ExitStack() as stack:
        if device is None and worker is None and settings.isolate and settings.devices == 1:
            worker = stack.enter_context(task_device_worker(plain, settings))
        if device is None:
            device = worker.device if worker is not None else tuning_device(settings)
        bound = bind(task, device)
        if not (force or retune) and context.db.best(bound.key) is not None:
            return None
        # each task in the study of its own key; with a worker given, on its one device
        run = settings.replace(study_name=None)
        if worker is not None:
            run = run.replace(devices=1)
        job = context.replace(settings=run, worker=worker, fresh=force, forget=forget)
        return tune_task(bound, job)
