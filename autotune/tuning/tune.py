"""Tuning, the public entry: `tune` (a call) and `tune_task` (a bound task, as every job runs one).

Both come to `tune_task`, which alone chooses between a kernel (autotune.tuning.kernel) and a variant
group (autotune.tuning.group, which tunes each member through the tuner), both below it, and
hands either the task as bound and one TuneContext (autotune.tuning.context).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from autotune.device import current_device
from autotune.errors import SignatureError
from autotune.runtime.variants import VariantGroup
from autotune.signature import is_array
from autotune.trial import TrialRecord
from autotune.tuning.context import TuneContext
from autotune.tuning.group import tune_group
from autotune.tuning.kernel import tune_kernel
from autotune.tuning.result import TuneResult
from autotune.tuning.settings import TuneSettings
from autotune.tuning.task import BoundTask, bind, kernel_of, task_of_call
from autotune.tuning.worker import DeviceWorker


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
    seed."""
    context = context.replace(settings=bound.task.settings(context.settings))
    if isinstance(bound.kernel, VariantGroup):
        return tune_group(bound, context)
    return tune_kernel(bound, context)
