"""Tuning all a program calls: `tune_program` turns the calls `calls_in` reads
(autotune.runtime.calls) into tuning tasks (one per call, with the run's budget) and runs them
as a job runs its tasks: already tuned ones skipped, a failure reported and the rest tuned,
studies resumed."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from autotune.runtime import state as runtime_state
from autotune.runtime.calls import ProgramCall, ProgramError, calls_in, load_program
from autotune.service.jobs import run_tasks
from autotune.service.progress import Display
from autotune.tuning.settings import TuneSettings
from autotune.tuning.storing import open_db
from autotune.tuning.task import task_of_call
from autotune.tuning.worker.parent import tuning_device

log = logging.getLogger(__name__)


def program_tasks_of(target: str, settings: Any) -> list[Any]:
    """The tasks of the program 'package.module:factory' (load_program, calls_in, then
    program_tasks)."""
    calls = calls_in(*load_program(target))
    if not calls:
        raise ProgramError(
            f"program {target!r} makes no @autotuned call: nothing to tune (its function calls "
            "no autotuned kernel with the arguments its factory gives)"
        )
    return program_tasks(calls, settings)


def program_tasks(calls: Sequence[ProgramCall], settings: Any) -> list[Any]:
    """One tuning task per call (calls whose caller passes the block sizes left out), each with
    the budget, strategy and seed of `settings` (a TuneSettings). A task's static arguments
    are the call's as its key counts them, defaults included, as a recorded miss's are: a
    forward call that leaves `precision` out and a backward one that passes its default are
    labelled by one rule."""
    from autotune.registry import resolve

    return [
        task_of_call(
            c.kernel, c.args, resolve(c.kernel).spec.static_arguments(c.args, c.kwargs), settings
        )
        for c in calls
        if c.source != "caller"
    ]


def tune_program(
    fn: Callable,
    args: Sequence[Any],
    kwargs: Mapping[str, Any] | None = None,
    *,
    db: Any = None,
    force: bool = False,
    show: Callable[[Any, Any], None] | bool = True,
    **settings: Any,
) -> list[Any]:
    """Tune every call of `calls_in(fn, args, kwargs)` that has no entry for this device and
    kernel version (all of them with `force=True`), each with the settings `tune()` takes (its
    budget per call); returns one Outcome per call: "tuned" (with the speedup), "skipped"
    (already tuned) or "failed" (why). One call failing does not stop the rest.

    `db` defaults to the database model code is served from, so that afterwards every call of
    `fn` is served from it. Progress is shown on stderr as `autotune tune --program` shows it
    (call i of N, trial j of M, the best so far, the time left); `show=False` keeps it to the
    log (INFO), and a function `show(progress, outcome)` is called as a job's (autotune.service.jobs)."""
    run = TuneSettings().replace(**settings)
    calls = calls_in(fn, args, kwargs)
    if not calls:
        log.warning(
            "tune_program: %s makes no @autotuned call: nothing to tune",
            getattr(fn, "__name__", fn),
        )
        return []
    tasks = program_tasks(calls, run)
    with contextlib.ExitStack() as stack:
        if show is True:
            from rich.console import Console

            show = stack.enter_context(Display(Console(stderr=True, highlight=False), "call"))
        device = tuning_device(run)
        handle = open_db(runtime_state.database_url() if db is None else db)
        if handle is not db:  # opened here: closed here
            stack.callback(handle.close)
        return run_tasks(
            tasks,
            device,
            db=handle,
            settings=run,
            force=force,
            show=show or _log_progress,
        )


def _log_progress(progress: Any, outcome: Any) -> None:
    if outcome is not None:
        log.info(
            "call %d of %d: %s: %s %s",
            progress.task_index,
            progress.n_tasks,
            outcome.task.label,
            outcome.status,
            outcome.detail,
        )
