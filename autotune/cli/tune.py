"""`autotune tune`: one kernel for one call signature, or the tasks of a job file, of the
recorded misses or of a program (--job, --pending, --program). The arguments are parsed and
checked here into a request that the tuning service runs (autotune.service.run); what the run
tells is printed here."""

from __future__ import annotations

import argparse
import contextlib
from typing import Any

from autotune.cli.common import DB_HELP, UsageError, add_import_argument, parse_static
from autotune.errors import AutotuneError, JobError, SettingsError
from autotune.measure.policies import WorkerLimits
from autotune.search.strategies import STRATEGIES
from autotune.service.progress import space_note
from autotune.service.run import RunListener, RunRequest, Started, run
from autotune.service.watch import MAX_WAIT_S
from autotune.sql import check_url
from autotune.trial import config_text
from autotune.tuning.settings import DEFAULTS, checked

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
    "workload": "--workload",
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
    t.add_argument(
        "--no-transfer",
        dest="transfer",
        action="store_false",
        help="search without what other device kinds measured of the kernel (by default their "
        "best configurations are measured first and guide the model)",
    )
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
        "--workload",
        default=DEFAULTS.workload,
        metavar="NAME",
        help="which of the kernel's workloads makes its integer data arguments (group sizes, "
        "sequence lengths, page tables; `autotune kernels` lists them); default: its first",
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
        help="measure on N local devices at once (all: every one; on a TPU its chips, a v7x "
        "chip's two TensorCores one device), a worker pinned to each, "
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
    request = _request(args)  # every check before the database is opened or a worker started
    if request.kernel is not None:
        return _tune_one(request)
    return _tune_many(request)


def _request(args: argparse.Namespace) -> RunRequest:
    """The run the command line asks for: its arguments parsed here first, then the settings
    and the database URLs checked."""
    if args.watch and not args.pending:
        raise UsageError("--watch watches for misses: give it with --pending")
    if args.only_kernel is not None and not args.pending:
        raise UsageError(
            "--kernel picks the kernel of --pending's misses: give it with --pending (one "
            "task names its kernel first: autotune tune KERNEL --shape ...)"
        )
    if not args.poll > 0:
        raise UsageError(f"--poll must be a positive number of seconds, got {args.poll}")
    asked = _asked(args)
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
        workload=args.workload,
        transfer=args.transfer,
    )
    for flag, url in (("--db", args.db), ("--storage", args.storage)):
        if url is not None:
            check_url(url, flag)
    imports = tuple(getattr(args, "imports", ()))
    return RunRequest(settings=settings, db=args.db, storage=args.storage, imports=imports, **asked)


def _asked(args: argparse.Namespace) -> dict[str, Any]:
    """What the command line asks to tune, parsed: one task (its kernel, shape, dtype and
    static arguments), or the tasks of a job file, of the misses or of a program (and which
    share of them)."""
    if not (args.job or args.pending or args.program):
        if args.kernel is None or args.shape is None:
            raise UsageError(
                "the following arguments are required: --shape and a kernel "
                "(or tune many with --job FILE or --pending)"
            )
        if args.shard or args.force:
            raise UsageError("--shard and --force apply to --job and --pending")
        static = parse_static(args.static)
        return {"kernel": args.kernel, "shape": args.shape, "dtype": args.dtype, "static": static}
    if sum(map(bool, (args.job, args.pending, args.program))) > 1:
        raise UsageError("give one of --job FILE, --pending and --program, not more")
    if args.kernel or args.shape:
        raise UsageError(
            "--job, --pending and --program take their kernels and shapes from the file, the misses "
            "or the program: "
            "drop the kernel and --shape (with --pending, --kernel K picks one kernel)"
        )
    return {
        "job": args.job,
        "pending": args.pending,
        "only_kernel": args.only_kernel,
        "watch": args.watch,
        "poll_s": args.poll,
        "program": args.program,
        "shard": parse_shard(args.shard) if args.shard else None,
        "force": args.force,
    }


def parse_shard(text: str) -> tuple[int, int]:
    """'2/4' -> (2, 4): shard indices run from 0 to N-1 (a Kubernetes JOB_COMPLETION_INDEX)."""
    i, sep, n = text.partition("/")
    if not sep or not i.isdigit() or not n.isdigit() or int(n) < 1 or int(i) >= int(n):
        raise JobError(f"malformed --shard {text!r}: write i/N with 0 <= i < N, e.g. 0/4")
    return int(i), int(n)


def _run(request: RunRequest, listener: RunListener) -> list[Any]:
    try:
        return run(request, listener)
    except SettingsError as e:  # a setting the run refused (--devices): named as its flag
        raise e.naming(FLAGS) from None


def _tune_one(request: RunRequest) -> int:
    """One task: a line per trial, then its result."""
    (outcome,) = _run(request, _TrialLines())
    if outcome.status == "failed":
        raise AutotuneError(outcome.detail)
    result = outcome.result
    speedup = f"{result.speedup:.2f}x" if result.speedup else "n/a"
    default = f"{result.default_time_s * 1e3:.4f} ms" if result.default_time_s else "failed"
    if result.resumed:
        print(f"resumed: {result.resumed_note}")
    print(
        f"\n{result.kernel} {result.key.signature} on {result.key.device_kind} ({result.key.backend})\n"
        f"  best     {config_text(result.best_config)}  {result.best_time_s * 1e3:.4f} ms"
        f"{result.side_by_side_note}\n"
        f"  default  {config_text(result.default_config)}  {default}\n"
        f"  speedup  {speedup}   trials {result.n_measured}{result.duplicates_note}"
        f"   rejected {result.n_rejected}"
        f"   crashed/timeout {result.n_crashed}   worker restarts {result.restarts}\n"
        f"  stored in {result.db_url}"
    )
    if result.programs_note:
        print(f"  programs: {result.programs_note}")
    if result.transfer_note:
        print(f"  transfer: {result.transfer_note}")
    if result.first_pass:
        print("  figures: first pass only (the finalists' side-by-side re-measurement failed)")
    if result.why_default_kept:
        print(f"  why 1.00x: {result.why_default_kept}")
    if result.within_noise:
        print(f"  noise: {result.within_noise}")
    for line in getattr(result, "member_lines", ()):  # a variant group's members
        print(f"  {line}")
    return 0


class _TrialLines(RunListener):
    """A single task's trials, a line each (naming the device where several measure)."""

    devices = False

    def started(self, run: Started) -> None:
        self.devices = run.devices != 1

    def __call__(self, p: Any, outcome: Any) -> None:
        if outcome is not None:
            return
        trial = p.record
        if p.trials_done == 1 and p.trial > 1:  # this run's first trial, after an interrupted one's
            print(
                f"resuming: {p.trial - 1} of {p.n_trials} trials already measured by an earlier run"
            )
        if p.trials_done == 1 and space_note(p):
            print(space_note(p).strip())
        if trial.status == "duplicate":  # not measured: the program of a trial stored before
            time = f"= #{trial.duplicate_of}".ljust(12) if trial.duplicate_of else " " * 12
        else:
            time = f"{trial.time_s * 1e3:9.4f} ms" if trial.time_s is not None else " " * 12
        device = f"  {trial.device}" if self.devices else ""  # which worker measured it
        origin = f"  (from {trial.transferred_from})" if trial.transferred_from else ""
        print(
            f"trial {p.trial:3d}/{p.n_trials}  {trial.status:13s} {time}{device}  "
            f"{config_text(trial.config)}{origin}",
            flush=True,
        )


def _tune_many(request: RunRequest) -> int:
    """--job / --pending / --program: each task with the settings and its own budget, strategy
    and seed, its progress on a console; --watch: misses as they come, until stopped."""
    with _JobDisplay() as display:
        outcomes = _run(request, display)
    counts = {s: sum(o.status == s for o in outcomes) for s in ("tuned", "skipped", "failed")}
    line = ", ".join(f"{n} {s}" for s, n in counts.items())
    if request.watch:
        print(f"stopped watching: {line}", flush=True)
        return 0
    unknown = display.unknown_misses
    if unknown:  # misses left untuned: the run did not do what it was asked
        n = sum(unknown.values())
        line += (
            f", {n} skipped-unknown (kernel{'s' * (len(unknown) > 1)} "
            f"{', '.join(sorted(unknown))} not registered here: --import MODULE)"
        )
    print(line)
    return 1 if counts["failed"] or unknown else 0


class _JobDisplay(RunListener):
    """A job's progress (autotune.service.progress.Display), after a line naming where it
    runs; the misses of kernels not registered here, a line each."""

    def __init__(self) -> None:
        from rich.console import Console

        self.console = Console(highlight=False)
        self.stack = contextlib.ExitStack()
        self.display: Any = None
        self.unknown_misses: dict[str, int] = {}  # by kernel

    def __enter__(self) -> _JobDisplay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack.close()

    def started(self, run: Started) -> None:
        from autotune.service.progress import Display

        studies = run.storage or "in memory"
        if run.tasks is None:
            device = run.device
            line = (
                f"watching {run.db_url} for misses on {device.device_kind} ({device.backend}); "
                f"studies {studies}; Ctrl-C or SIGTERM ends it"
            )
        else:
            line = f"{run.tasks} task(s); database {run.db_url}; studies {studies}"
        self.console.print(line, markup=False, soft_wrap=True)
        self.display = self.stack.enter_context(Display(self.console))

    def unknown(self, kernel: str, misses: int) -> None:
        self.unknown_misses[kernel] = misses
        print(
            f"skipped {misses} pending miss(es) of kernel {kernel!r}: not registered here "
            "(name the module that registers it with --import MODULE)",
            flush=True,
        )

    def __call__(self, progress: Any, outcome: Any) -> None:
        self.display(progress, outcome)
