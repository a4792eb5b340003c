"""Running what `autotune tune` asks: the one call a front end makes (`run`), with the request
it built from its own arguments (`RunRequest`) and a listener that hears the run as it goes.

The run decides the rest, in this order, before it opens the database or starts a worker:
where the tasks are measured (under isolation this process keeps to the CPU and its device
workers own the accelerator; several devices counted against what a worker sees), the user's
modules imported, every task made and checked (the request's one task, a job file's, a
program's calls). Then, with the database open: the device that keys the tasks, the studies'
storage (beside a SQLite database unless given), the recorded misses and the shard, and the
tasks run by the job runner (autotune.service.jobs) or, for misses as they come, by the
watcher (autotune.service.watch).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from autotune.device import DeviceInfo
from autotune.registry import import_modules
from autotune.service.jobfile import load_job
from autotune.service.jobs import run_tasks, shard
from autotune.service.progress import JobProgress, Outcome
from autotune.service.watch import MAX_WAIT_S, watch
from autotune.tuning.settings import TuneSettings
from autotune.tuning.task import Task, check_task, make_task
from autotune.tuning.worker import device_count


@dataclass(frozen=True)
class RunRequest:
    """A run as a front end asks it, its arguments parsed and checked there: one task (the
    text of `kernel`, `shape` and `dtype`, and `static` arguments), or every task of a `job`
    file, of the recorded misses (`pending`, of `only_kernel` where given; with `watch`, as
    they are recorded, looking at least every `poll_s` seconds) or of a `program`
    ('module:factory'), share `shard` (i, N) of them. `settings` are the run's (each task
    brings its own budget, strategy and seed); `db` and `storage` where the tuning database
    and the studies are (None: the defaults); `force` re-tunes tasks tuned already; `imports`
    are modules that register the user's kernels."""

    settings: TuneSettings
    kernel: str | None = None
    shape: str | None = None
    dtype: str = "float32"
    static: Mapping[str, Any] = field(default_factory=dict)
    job: str | None = None
    pending: bool = False
    only_kernel: str | None = None
    watch: bool = False
    poll_s: float = MAX_WAIT_S
    program: str | None = None
    shard: tuple[int, int] | None = None
    force: bool = False
    db: str | None = None
    storage: str | None = None
    imports: tuple[str, ...] = ()


@dataclass(frozen=True)
class Started:
    """A run about to tune: its database open, its `tasks` known (None: misses as they come),
    measured on `devices` local devices at once, on `device` (None for a run of one task,
    bound to its worker's device once that starts), its studies in `storage` (None: in
    memory)."""

    db_url: str
    storage: str | None
    tasks: int | None
    devices: int
    device: DeviceInfo | None = None


class RunListener:
    """What a run tells whoever asked for it, as it goes (the command line prints it); each
    hears nothing here."""

    def started(self, run: Started) -> None:
        """The run starts tuning (see Started)."""

    def unknown(self, kernel: str, misses: int) -> None:
        """`misses` recorded misses of `kernel`, which is not registered here: skipped."""

    def __call__(self, progress: JobProgress, outcome: Outcome | None) -> None:
        """A trial measured (`outcome` None), or a task's outcome."""


def run(request: RunRequest, listener: RunListener | None = None) -> list[Outcome]:
    """Run `request`: every task's outcome, in order (for `watch`, those tuned until it was
    interrupted). A run of one task tunes it whether or not it is tuned already and, with its
    studies beside a SQLite database, deletes its study once it is tuned, so that the next run
    tunes afresh (one interrupted resumes it)."""
    from autotune.db import TuningDB
    from autotune.search.studies import default_storage
    from autotune.service.pending import pending_tasks
    from autotune.tuning.worker.parent import tuning_device

    listener = listener or RunListener()
    settings = _placed(request.settings)
    import_modules(request.imports)  # after JAX_PLATFORMS is set: a module may import JAX
    tasks = _tasks(request, settings)  # checked before the database is opened
    one = request.kernel is not None
    with TuningDB(request.db) as db:
        # the workers' device keys the tasks (this process keeps to the CPU); one task is
        # bound to the device its worker reports, once it starts
        device = None if one else tuning_device(settings)
        # without a storage given, a study beside a SQLite database: a rerun after a crash
        # resumes it; --time-limit and --patience bound each task's search
        storage = request.storage or default_storage(db.url)
        run = settings.replace(storage=storage)
        if request.watch:
            listener.started(Started(db.url, storage, None, settings.devices, device))
            return _watch(request, db, device, run, listener)
        if request.pending:
            tasks, unknown = pending_tasks(
                db, device, kernel=request.only_kernel, settings=settings
            )
            for name, count in unknown.items():
                listener.unknown(name, count)
        if request.shard:
            tasks = shard(tasks, *request.shard)
        listener.started(Started(db.url, storage, len(tasks), settings.devices, device))
        # one task is tuned whether or not it is tuned already, and where no storage was
        # given its study is deleted once it is tuned (the next run tunes afresh)
        return run_tasks(
            tasks,
            device,
            db=db,
            settings=run,
            force=request.force,
            retune=one,
            forget=one and not request.storage,
            show=listener,
        )


def _placed(settings: TuneSettings) -> TuneSettings:
    """The settings as this process carries them out: on several devices, a worker pinned to
    each, as many as asked (`all`: every one a worker sees), counted before anything is
    written; under isolation the device is the workers' (a TPU admits one process): this
    process makes inputs and the interpret-mode oracle on the CPU, the workers see the
    platforms asked for."""
    if settings.devices != 1:
        settings = settings.replace(isolate=True)
    if settings.isolate and "jax" not in sys.modules:
        settings = settings.replace(worker_platforms=os.environ.get("JAX_PLATFORMS", ""))
        os.environ["JAX_PLATFORMS"] = "cpu"
    if settings.devices != 1:  # asked once, of the workers' platforms
        settings = settings.replace(devices=device_count(settings))
    return settings


def _tasks(request: RunRequest, settings: TuneSettings) -> list[Task]:
    """The tasks the request names, each made and checked: a job file's, a program's calls',
    or its one task (traced, too, at its default configuration); none for the misses, which
    are read from the database."""
    from autotune.service.program import program_tasks_of

    if request.job:
        return load_job(request.job)
    if request.program:
        return program_tasks_of(request.program, settings)
    if request.kernel is None:
        return []
    task = make_task(
        request.kernel,
        request.shape,
        request.dtype,
        dict(request.static),
        settings.n_trials,
        settings.strategy,
        settings.seed,
        workload=settings.workload,
    )
    check_task(task, request.shape, trace=True)
    return [task]


def _watch(
    request: RunRequest, db: Any, device: DeviceInfo, settings: TuneSettings, listener: RunListener
) -> list[Outcome]:
    """Misses tuned as they are recorded, until Ctrl-C or SIGTERM: their outcomes."""
    outcomes: list[Outcome] = []

    def show(progress: JobProgress, outcome: Outcome | None) -> None:
        if outcome is not None:
            outcomes.append(outcome)
        listener(progress, outcome)

    # SIGTERM (SystemExit here) is how a service is told to stop, as Ctrl-C is
    with contextlib.suppress(KeyboardInterrupt, SystemExit):
        watch(
            db,
            device,
            settings=settings,
            kernel=request.only_kernel,
            max_wait_s=request.poll_s,
            show=show,
            unknown=listener.unknown,
        )
    return outcomes
