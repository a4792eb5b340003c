"""`autotune tune`: one kernel for one call signature, or the tasks of a job file or of the
recorded misses (--job, --pending)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Any

from autotune.cli.common import (
    DB_HELP,
    UsageError,
    add_import_argument,
    import_user_modules,
    parse_static,
)
from autotune.errors import AutotuneError, SettingsError
from autotune.measure.policies import WorkerLimits
from autotune.search.strategies import STRATEGIES
from autotune.service import jobfile, jobs
from autotune.service.watch import MAX_WAIT_S
from autotune.sql import check_url
from autotune.trial import config_text
from autotune.tuning.settings import DEFAULTS, TuneSettings, checked
from autotune.tuning.task import check_task, make_task
from autotune.tuning.worker import device_count

# the flags that set the tuning settings, by field: a refusal names the flag
FLAGS = {
    "n_trials": "--trials",
    "limits.compile_s": "--compile-timeout",
    "limits.run_s": "--run-timeout",
    "time_limit_s": "--time-limit",
    "patience": "--patience",
    "seed": "--seed",
    "finalists": "--finalists",
    "compile_workers": "--compile-workers",
    "devices": "--devices",
    "max_memory": "--max-memory",
}


def add_parser(sub: Any) -> None:
    t = sub.add_parser("tune", help="tune a kernel for one call signature on this device")
    t.add_argument("kernel", nargs="?", help="a registered kernel name, or package.module:function")
    t.add_argument("--shape", help="argument shapes, e.g. 256x256,256x256")
    t.add_argument(
        "--dtype", default="float32", help="dtype of every argument, or one per argument"
    )
    t.add_argument(
        "--static", action="append", default=[], metavar="NAME=VALUE", help="a static argument"
    )
    t.add_argument(
        "--trials",
        type=int,
        default=DEFAULTS.n_trials,
        help="distinct programs to measure (configurations compiling alike: measured once)",
    )
    t.add_argument("--strategy", choices=STRATEGIES, default=DEFAULTS.strategy)
    t.add_argument("--seed", type=int, default=DEFAULTS.seed)
    t.add_argument(
        "--time-limit",
        type=float,
        default=DEFAULTS.time_limit_s,
        help="stop each search after this many seconds",
    )
    t.add_argument(
        "--patience",
        type=int,
        default=DEFAULTS.patience,
        help="stop each search after N trials without improvement",
    )
    t.add_argument("--db", default=None, help=DB_HELP)
    add_job_arguments(t)

    t.add_argument(
        "--no-isolate",
        dest="isolate",
        action="store_false",
        help="measure in this process (no device worker: a crashing candidate ends the run)",
    )
    t.add_argument(
        "--compile-timeout",
        type=float,
        default=DEFAULTS.limits.compile_s,
        metavar="S",
        help="seconds one candidate may take to compile before it is a `timeout` trial",
    )
    t.add_argument(
        "--run-timeout",
        type=float,
        default=DEFAULTS.limits.run_s,
        metavar="S",
        help="seconds one candidate may take to verify and time before it is a `timeout` trial",
    )
    t.add_argument(
        "--max-memory",
        type=int,
        default=DEFAULTS.max_memory,
        metavar="BYTES",
        help="refuse candidates whose compiled program's peak memory (the compiler's memory "
        "analysis) is above BYTES: compiled, never run (status over_memory)",
    )
    t.add_argument(
        "--compile-workers",
        type=int,
        default=DEFAULTS.compile_workers,
        metavar="N",
        help="threads compiling queued candidates while one is timed "
        "(default: up to 4 on an accelerator, 0 on the CPU)",
    )
    t.add_argument(
        "--devices",
        type=_devices,
        default=DEFAULTS.devices,
        metavar="N|all",
        help="measure on N local devices at once (all: every one), a worker pinned to each, "
        "sharing each task's --trials (default: 1)",
    )
    t.add_argument(
        "--finalists",
        type=int,
        default=DEFAULTS.finalists,
        help="the fastest candidates re-measured interleaved before choosing (0: none)",
    )
    t.set_defaults(run=cmd_tune)


def add_job_arguments(t: argparse.ArgumentParser) -> None:
    g = t.add_argument_group("many tasks, many machines")
    g.add_argument("--job", metavar="FILE", help="tune every task of a TOML job file")
    g.add_argument(
        "--pending",
        action="store_true",
        help="tune every lookup miss recorded for this device kind (see `autotune db misses`)",
    )
    g.add_argument(
        "--program",
        metavar="MODULE:FACTORY",
        help="tune every @autotuned call of a program (see `autotune calls`)",
    )
    g.add_argument("--kernel", dest="only_kernel", help="with --pending: only this kernel")
    g.add_argument(
        "--watch",
        action="store_true",
        help="with --pending: keep running, tuning misses as model code records them "
        "(Ctrl-C or SIGTERM ends it)",
    )
    g.add_argument(
        "--poll",
        type=float,
        default=MAX_WAIT_S,
        metavar="S",
        help=f"with --watch: the longest wait between looks for misses when idle (default {MAX_WAIT_S:g})",
    )
    g.add_argument("--shard", metavar="I/N", help="run share I of N (0 <= I < N) of the tasks")
    g.add_argument("--force", action="store_true", help="re-tune tasks already tuned")
    g.add_argument(
        "--storage",
        help="Optuna RDB storage URL for the studies (shared by workers; resumable). Default: "
        "a SQLite file beside a SQLite tuning database, or a PostgreSQL tuning database itself",
    )
    add_import_argument(g)


def _devices(text: str) -> int | str:
    """--devices: "all", else a number (checked with the other settings)."""
    if text == "all":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a number of devices nor all: e.g. --devices 4"
        ) from None


def cmd_tune(args: argparse.Namespace) -> int:
    # every check comes before the database is opened or a worker started: nothing is written
    if args.watch and not args.pending:
        raise UsageError("--watch watches for misses: give it with --pending")
    if args.only_kernel is not None and not args.pending:
        raise UsageError(
            "--kernel picks the kernel of --pending's misses: give it with --pending (one "
            "task names its kernel first: autotune tune KERNEL --shape ...)"
        )
    if not args.poll > 0:
        raise UsageError(f"--poll must be a positive number of seconds, got {args.poll}")
    settings = checked(
        FLAGS,
        n_trials=args.trials,
        strategy=args.strategy,
        seed=args.seed,
        time_limit_s=args.time_limit,
        patience=args.patience,
        finalists=args.finalists,
        isolate=args.isolate,
        limits=WorkerLimits(compile_s=args.compile_timeout, run_s=args.run_timeout),
        compile_workers=args.compile_workers,
        max_memory=args.max_memory,
        devices=args.devices,
    )
    if settings.devices != 1:  # a worker pinned to each device
        settings = settings.replace(isolate=True)
    for flag, url in (("--db", args.db), ("--storage", args.storage)):
        if url is not None:
            check_url(url, flag)
    if settings.isolate and "jax" not in sys.modules:
        # The device belongs to the worker (a TPU admits one process): this process makes
        # inputs and the interpret-mode oracle on the CPU; the worker sees the platforms asked for.
        settings = settings.replace(worker_platforms=os.environ.get("JAX_PLATFORMS", ""))
        os.environ["JAX_PLATFORMS"] = "cpu"
    if settings.devices != 1:  # as many as a worker sees, asked once, before anything is written
        try:
            settings = settings.replace(devices=device_count(settings))
        except SettingsError as e:
            raise e.naming(FLAGS) from None
    import_user_modules(args)  # after JAX_PLATFORMS is set: the module may import JAX
    if args.job or args.pending or args.program:
        return cmd_tune_job(args, settings)

    from autotune.search import studies

    if args.kernel is None or args.shape is None:
        raise UsageError(
            "the following arguments are required: --shape and a kernel "
            "(or tune many with --job FILE or --pending)"
        )
    if args.shard or args.force:
        raise UsageError("--shard and --force apply to --job and --pending")
    static = parse_static(args.static)
    one = make_task(
        args.kernel,
        args.shape,
        args.dtype,
        static,
        settings.n_trials,
        settings.strategy,
        settings.seed,
    )
    check_task(one, args.shape)
    # without --storage, a study beside a SQLite database: a rerun after a crash resumes it,
    # and a finished run deletes it, so the next run tunes afresh
    storage = args.storage or studies.default_storage(args.db)

    def show(p: Any, outcome: Any) -> None:
        if outcome is not None:
            return
        trial = p.record
        if p.trials_done == 1 and p.trial > 1:  # this run's first trial, after an interrupted one's
            print(
                f"resuming: {p.trial - 1} of {p.n_trials} trials already measured by an earlier run"
            )
        if trial.status == "duplicate":  # not measured: the program of a trial stored before
            time = f"= #{trial.duplicate_of}".ljust(12) if trial.duplicate_of else " " * 12
        else:
            time = f"{trial.time_s * 1e3:9.4f} ms" if trial.time_s is not None else " " * 12
        device = f"  {trial.device}" if settings.devices != 1 else ""  # which worker measured it
        print(
            f"trial {p.trial:3d}/{p.n_trials}  {trial.status:13s} {time}{device}  "
            f"{config_text(trial.config)}",
            flush=True,
        )

    # the same job runner as every other task, tuning it whether or not it is tuned already
    run = settings.replace(storage=storage)
    (outcome,) = jobs.run_tasks([one], None, db=args.db, settings=run, retune=True, show=show)
    if outcome.status == "failed":
        raise AutotuneError(outcome.detail)
    result = outcome.result
    speedup = f"{result.speedup:.2f}x" if result.speedup else "n/a"
    default = f"{result.default_time_s * 1e3:.4f} ms" if result.default_time_s else "failed"
    if storage and not args.storage:
        members = getattr(result, "members", {}).values()  # a variant group's tuned members
        for key in [result.key, *(m.key for m in members if m is not None)]:
            studies.delete_study(storage, studies.study_name_of(key), unless_in_use=True)
    if result.resumed:
        print(f"resumed: {jobs.resumed_text(result)}")
    print(
        f"\n{result.kernel} {result.key.signature} on {result.key.device_kind} ({result.key.backend})\n"
        f"  best     {config_text(result.best_config)}  {result.best_time_s * 1e3:.4f} ms\n"
        f"  default  {config_text(result.default_config)}  {default}\n"
        f"  speedup  {speedup}   trials {result.n_measured}{jobs.duplicates(result)}"
        f"   rejected {result.n_rejected}"
        f"   crashed/timeout {result.n_crashed}   worker restarts {result.restarts}\n"
        f"  stored in {result.db_url}"
    )
    if result.programs_note:
        print(f"  programs: {result.programs_note}")
    if result.first_pass:
        print("  figures: first pass only (the finalists' side-by-side re-measurement failed)")
    if result.why_default_kept:
        print(f"  why 1.00x: {result.why_default_kept}")
    if result.within_noise:
        print(f"  noise: {result.within_noise}")
    for line in getattr(result, "member_lines", ()):  # a variant group's members
        print(f"  {line}")
    return 0


def cmd_tune_job(args: argparse.Namespace, settings: TuneSettings) -> int:
    """--job / --pending: each task with `settings` and its own budget, strategy and seed."""
    from rich.console import Console

    from autotune.db import TuningDB
    from autotune.search.studies import default_storage
    from autotune.service.pending import pending_tasks
    from autotune.service.program import program_tasks_of
    from autotune.service.progress import Display
    from autotune.tuning.worker.parent import tuning_device

    if sum(map(bool, (args.job, args.pending, args.program))) > 1:
        raise UsageError("give one of --job FILE, --pending and --program, not more")
    if args.kernel or args.shape:
        raise UsageError(
            "--job, --pending and --program take their kernels and shapes from the file, the misses "
            "or the program: "
            "drop the kernel and --shape (with --pending, --kernel K picks one kernel)"
        )
    shard = jobs.parse_shard(args.shard) if args.shard else None
    tasks = jobfile.load_job(args.job) if args.job else []  # every task checked before the database
    if args.program:
        tasks = program_tasks_of(args.program, settings)
    with TuningDB(args.db) as db:
        device = tuning_device(settings)  # the worker's: this process keeps to the CPU
        if args.watch:
            return watch_misses(args, db, device, settings)
        if args.pending:
            tasks, unknown = pending_tasks(db, device, kernel=args.only_kernel, settings=settings)
            for name, count in unknown.items():
                _unknown(name, count)
        if shard:
            tasks = jobs.shard(tasks, *shard)
        storage = args.storage or default_storage(db.url)
        console = Console(highlight=False)
        console.print(
            f"{len(tasks)} task(s); database {db.url}; studies {storage or 'in memory'}",
            markup=False,
            soft_wrap=True,
        )
        with Display(console) as display:
            # --time-limit and --patience bound each task's search, as they bound a single one
            run = settings.replace(storage=storage)
            outcomes = jobs.run_tasks(
                tasks, device, db=db, settings=run, force=args.force, show=display
            )
    counts = {s: sum(o.status == s for o in outcomes) for s in ("tuned", "skipped", "failed")}
    print(", ".join(f"{n} {s}" for s, n in counts.items()))
    return 1 if counts["failed"] else 0


def _unknown(name: str, count: int) -> None:
    print(
        f"skipped {count} pending miss(es) of kernel {name!r}: not registered here "
        "(name the module that registers it with --import MODULE)",
        flush=True,
    )


def watch_misses(args: argparse.Namespace, db: Any, device: Any, settings: TuneSettings) -> int:
    """--pending --watch: tune misses as they are recorded, until Ctrl-C or SIGTERM."""
    from rich.console import Console

    from autotune.search.studies import default_storage
    from autotune.service.progress import Display
    from autotune.service.watch import watch

    storage = args.storage or default_storage(db.url)
    console = Console(highlight=False)
    console.print(
        f"watching {db.url} for misses on {device.device_kind} ({device.backend}); studies "
        f"{storage or 'in memory'}; Ctrl-C or SIGTERM ends it",
        markup=False,
        soft_wrap=True,
    )
    counts = {"tuned": 0, "skipped": 0, "failed": 0}
    with Display(console) as display:

        def show(progress: Any, outcome: Any) -> None:
            if outcome is not None:
                counts[outcome.status] += 1
            display(progress, outcome)

        # SIGTERM (SystemExit here) is how a service is told to stop, as Ctrl-C is
        with contextlib.suppress(KeyboardInterrupt, SystemExit):
            watch(
                db,
                device,
                settings=settings.replace(storage=storage),
                kernel=args.only_kernel,
                max_wait_s=args.poll,
                show=show,
                unknown=_unknown,
            )
    print("stopped watching: " + ", ".join(f"{n} {s}" for s, n in counts.items()), flush=True)
    return 0
