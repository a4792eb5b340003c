"""The `autotune` command: tune kernels, list them, and query the tuning database."""

from __future__ import annotations

import argparse
import csv
import io
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from autotune import cli_db, jobs
from autotune.db import check_url
from autotune.errors import AutotuneError, SignatureError
from autotune.jobs import parse_dtypes, parse_shapes  # noqa: F401  (re-exported)
from autotune.strategies import DEFAULT_STRATEGY, STRATEGIES
from autotune.tune_settings import TuneSettings, checked
from autotune.worker import DEFAULT_LIMITS, WorkerLimits

FORMATS = ("table", "json", "csv")
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
}


class UsageError(AutotuneError):
    """A command line that cannot be carried out as written."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2, no usage dump
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def parse_static(items: Sequence[str]) -> dict[str, Any]:
    """--static causal=true --static sm_scale=0.125: values are JSON (bare words are strings)."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            raise SignatureError(f"malformed --static {item!r}: write name=value, e.g. causal=true")
        try:
            out[name] = json.loads(value)
        except json.JSONDecodeError:
            out[name] = value
    return out


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="autotune", description="Autotune block sizes of JAX Pallas kernels.")
    p.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    t = sub.add_parser("tune", help="tune a kernel for one call signature on this device")
    t.add_argument("kernel", nargs="?", help="a registered kernel name, or package.module:function")
    t.add_argument("--shape", help="argument shapes, e.g. 256x256,256x256")
    t.add_argument(
        "--dtype", default="float32", help="dtype of every argument, or one per argument"
    )
    t.add_argument(
        "--static", action="append", default=[], metavar="NAME=VALUE", help="a static argument"
    )
    t.add_argument("--trials", type=int, default=32, help="distinct configurations to measure")
    t.add_argument("--strategy", choices=STRATEGIES, default=DEFAULT_STRATEGY)
    t.add_argument("--seed", type=int, default=None)
    t.add_argument("--time-limit", type=float, default=None, help="stop after this many seconds")
    t.add_argument(
        "--patience", type=int, default=None, help="stop after N trials without improvement"
    )
    t.add_argument(
        "--db",
        default=None,
        help="SQLAlchemy URL or file (default: $PALLAS_AUTOTUNE_DB or the user cache)",
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
        default=DEFAULT_LIMITS.compile_s,
        metavar="S",
        help="seconds one candidate may take to compile before it is a `timeout` trial",
    )
    t.add_argument(
        "--run-timeout",
        type=float,
        default=DEFAULT_LIMITS.run_s,
        metavar="S",
        help="seconds one candidate may take to verify and time before it is a `timeout` trial",
    )
    t.add_argument(
        "--compile-workers",
        type=int,
        default=None,
        metavar="N",
        help="threads compiling queued candidates while one is timed "
        "(default: up to 4 on an accelerator, 0 on the CPU)",
    )
    t.add_argument(
        "--finalists",
        type=int,
        default=3,
        help="the fastest candidates re-measured interleaved before choosing (0: none)",
    )

    c = sub.add_parser(
        "check",
        help="does every candidate of a kernel's space lower for TPU, or a Mosaic GPU kernel's "
        "for a GPU? (no device needed)",
    )
    c.add_argument("kernel", help="a registered kernel name, or package.module:function")
    c.add_argument("--platform", choices=("tpu", "gpu"), default="tpu")
    c.add_argument("--shape", required=True, help="argument shapes, e.g. 256x256,256x256")
    c.add_argument(
        "--dtype", default="float32", help="dtype of every argument, or one per argument"
    )
    c.add_argument("--static", action="append", default=[], metavar="NAME=VALUE")
    c.add_argument(
        "--device-kind", default=None, help="the device whose limits the constraints apply"
    )
    c.add_argument(
        "--sample", type=int, default=None, help="check N candidates spread over the space"
    )
    add_import_argument(c)

    add_import_argument(
        sub.add_parser("kernels", help="list registered kernels and their tunable parameters")
    )

    d = sub.add_parser("db", help="query the tuning database")
    dsub = d.add_subparsers(dest="db_command", required=True, parser_class=_Parser)
    for name, help_ in (
        ("list", "best entries"),
        ("trials", "every measured trial"),
        ("misses", "lookups model code made that the database could not answer"),
    ):
        q = dsub.add_parser(name, help=help_)
        q.add_argument("--kernel")
        q.add_argument("--device-kind")
        q.add_argument("--platform")
        q.add_argument("--dtype")
        q.add_argument("--format", choices=FORMATS, default="table")
        q.add_argument("--db", default=None)
    add_db_check_parser(dsub)
    cli_db.add_parsers(dsub)
    for name in ("check", "stale", "prune"):  # the db commands that resolve kernels
        add_import_argument(dsub.choices[name])

    r = sub.add_parser("report", help="an HTML report of tuned entries (PNGs with matplotlib)")
    r.add_argument("--kernel")
    r.add_argument("--out", required=True, metavar="DIR", help="directory to write into")
    r.add_argument("--db", default=None)
    add_landscape_parser(dsub)
    return p


def add_import_argument(p: argparse.ArgumentParser) -> None:
    """--import MODULE for every command that resolves kernels: the user's own kernels are
    registered by importing the module that defines them."""
    p.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import a module that registers your own kernels (repeatable)",
    )


def import_user_modules(args: argparse.Namespace) -> None:
    jobs.import_modules(getattr(args, "imports", ()))


def add_landscape_parser(dsub: Any) -> None:
    q = dsub.add_parser(
        "landscape", help="write an exhaustive run's trials as a landscape CSV (for replay)"
    )
    q.add_argument("--kernel", required=True)
    q.add_argument("--signature", required=True, help="e.g. f32[64,128]")
    q.add_argument("--device-kind")
    q.add_argument("--output", "-o", help="file to write (.csv, or .csv.gz); default: stdout")
    q.add_argument("--db", default=None)


def cmd_db_landscape(args: argparse.Namespace) -> int:
    from autotune.db import TuningDB
    from autotune.landscape import landscape_rows, write_landscape

    with TuningDB(args.db) as db:
        header, rows = landscape_rows(db, args.kernel, args.signature, args.device_kind)
    text = write_landscape(args.output, header, rows)
    if args.output is None:
        print(text, end="")
    else:
        print(f"wrote {len(rows)} configurations to {args.output}", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        logging.basicConfig(
            level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s"
        )
        return COMMANDS[args.command](args)
    except AutotuneError as e:
        print(f"autotune: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("autotune: interrupted", file=sys.stderr)
        return 130


def cmd_tune(args: argparse.Namespace) -> int:
    # every check comes before the database is opened or a worker started: nothing is written
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
    )
    for flag, url in (("--db", args.db), ("--storage", args.storage)):
        if url is not None:
            check_url(url, flag)
    if settings.isolate and "jax" not in sys.modules:
        # The device belongs to the worker (a TPU admits one process): this process makes
        # inputs and the interpret-mode oracle on the CPU; the worker sees the platforms asked for.
        settings = settings.replace(worker_platforms=os.environ.get("JAX_PLATFORMS", ""))
        os.environ["JAX_PLATFORMS"] = "cpu"
    import_user_modules(args)  # after JAX_PLATFORMS is set: the module may import JAX
    if args.job or args.pending:
        return cmd_tune_job(args, settings)

    import jax

    from autotune.registry import resolve
    from autotune.tuner import study_name_of, tune

    if args.kernel is None or args.shape is None:
        raise UsageError(
            "the following arguments are required: --shape and a kernel "
            "(or tune many with --job FILE or --pending)"
        )
    if args.shard or args.force:
        raise UsageError("--shard and --force apply to --job and --pending")
    if "" not in sys.path:  # import paths name the user's modules, found from where they stand
        sys.path.insert(0, "")
    kernel = args.kernel
    shapes = parse_shapes(args.shape)
    dtypes = parse_dtypes(args.dtype, len(shapes))
    static = parse_static(args.static)
    inputs = [jax.ShapeDtypeStruct(s, d) for s, d in zip(shapes, dtypes)]
    jobs.check_inputs_fit(shapes, dtypes)
    jobs.check_call(resolve(kernel), inputs, static, args.shape)
    # without --storage, a study beside a SQLite database: a rerun after a crash resumes it,
    # and a finished run deletes it, so the next run tunes afresh
    storage = args.storage or jobs.default_storage(args.db)

    def progress(trial: Any, i: int, n: int) -> None:
        time = f"{trial.time_s * 1e3:9.4f} ms" if trial.time_s is not None else " " * 12
        print(
            f"trial {i:3d}/{n}  {trial.status:13s} {time}  {_config_text(trial.config)}", flush=True
        )

    try:
        result = tune(
            kernel,
            inputs,
            kwargs=static,
            settings=settings,
            db=args.db,
            progress=progress,
            storage=storage,
        )
    except TypeError as e:  # the kernel's own signature refused the arguments
        raise UsageError(
            f"{args.kernel} cannot be called with --shape {args.shape} --static {static}: {e}"
        ) from None
    speedup = f"{result.speedup:.2f}x" if result.speedup else "n/a"
    default = f"{result.default_time_s * 1e3:.4f} ms" if result.default_time_s else "failed"
    if storage and not args.storage:
        jobs.delete_study(storage, study_name_of(result.key))
    if result.resumed:
        print(f"resumed: {jobs.resumed_text(result)}")
    print(
        f"\n{result.kernel} {result.key.signature} on {result.key.device_kind} ({result.key.backend})\n"
        f"  best     {_config_text(result.best_config)}  {result.best_time_s * 1e3:.4f} ms\n"
        f"  default  {_config_text(result.default_config)}  {default}\n"
        f"  speedup  {speedup}   trials {len(result.trials)}   rejected {result.n_rejected}"
        f"   crashed/timeout {result.n_crashed}   worker restarts {result.restarts}\n"
        f"  stored in {result.db_url}"
    )
    if result.why_default_kept:
        print(f"  why 1.00x: {result.why_default_kept}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    import jax

    from autotune.check import DEFAULT_KINDS, check_space
    from autotune.registry import resolve

    import_user_modules(args)
    kernel = resolve(args.kernel)
    shapes = parse_shapes(args.shape)
    dtypes = parse_dtypes(args.dtype, len(shapes))
    inputs = [jax.ShapeDtypeStruct(s, d) for s, d in zip(shapes, dtypes)]
    static = parse_static(args.static)
    jobs.check_call(kernel, inputs, static, args.shape)
    kind = args.device_kind or DEFAULT_KINDS[args.platform]
    if args.sample is not None and args.sample < 1:
        raise UsageError(f"--sample {args.sample}: give a positive number of candidates")
    rows = check_space(kernel, inputs, static, args.platform, kind, args.sample)
    print(
        _table(
            [
                {
                    "config": _config_text(r.config),
                    "constraints": "accept" if r.accepted else "refuse: " + ", ".join(r.violations),
                    f"lowers for {args.platform}": "yes"
                    if r.lowering_error is None
                    else r.lowering_error[:100],
                }
                for r in rows
            ]
        )
    )
    bad = [r for r in rows if r.accepted and r.lowering_error is not None]
    n_ok = sum(r.accepted for r in rows)
    print(
        f"\n{kernel.spec.name} {','.join(args.shape.split(','))} on {kind}: {len(rows)} candidates, "
        f"{n_ok} accepted by the constraints, {len(bad)} of those do not lower"
    )
    return 1 if bad else 0


def cmd_kernels(args: argparse.Namespace) -> int:
    from autotune.device import current_device
    from autotune.registry import registered

    import_user_modules(args)
    platform = current_device().platform
    rows = []
    for name, kernel in registered().items():
        spec = kernel.spec
        space = spec.space(platform)
        params = "; ".join(f"{p.name} in {list(p.values)}" for p in space.params)
        rows.append({"kernel": name, "version": spec.version, f"parameters ({platform})": params})
    print(_table(rows))
    return 0


def cmd_db(args: argparse.Namespace) -> int:
    from autotune.db import TuningDB

    import_user_modules(args)
    if args.db_command == "check":
        return cmd_db_check(args)
    cli_db.check_arguments(args)  # before the database is opened: nothing is created
    if args.db_command in cli_db.COMMANDS:
        with TuningDB(args.db) as db:
            return cli_db.COMMANDS[args.db_command](args, db, render)
    if args.db_command == "landscape":
        return cmd_db_landscape(args)

    filters = {
        "kernel": args.kernel,
        "device_kind": args.device_kind,
        "platform": args.platform,
        "dtype": args.dtype,
    }
    with TuningDB(args.db) as db:
        select = {"list": db.query, "trials": db.trials, "misses": db.misses}[args.db_command]
        rows = select(**filters)
    print(render(rows, args.format))
    return 0


def add_db_check_parser(dsub: Any) -> None:
    c = dsub.add_parser("check", help="report, in words, every problem the runtime would meet")
    c.add_argument("--db", default=None)


def cmd_db_check(args: argparse.Namespace) -> int:
    """Exit 0 when the database is sound, 1 when it has problems (each printed on a line)."""
    from autotune.db import normalize_url
    from autotune.dbcheck import check_database, format_report

    url = normalize_url(args.db)
    problems, counts = check_database(url)
    print(format_report(url, problems, counts))
    return 1 if problems else 0


def add_job_arguments(t: argparse.ArgumentParser) -> None:
    g = t.add_argument_group("many tasks, many machines")
    g.add_argument("--job", metavar="FILE", help="tune every task of a TOML job file")
    g.add_argument(
        "--pending",
        action="store_true",
        help="tune every lookup miss recorded for this device kind (see `autotune db misses`)",
    )
    g.add_argument("--kernel", dest="only_kernel", help="with --pending: only this kernel")
    g.add_argument("--shard", metavar="I/N", help="run share I of N (0 <= I < N) of the tasks")
    g.add_argument("--force", action="store_true", help="re-tune tasks already tuned")
    g.add_argument(
        "--storage",
        help="Optuna RDB storage URL for the studies (shared by workers; resumable). Default "
        "with --job/--pending: a SQLite file beside a SQLite tuning database",
    )
    add_import_argument(g)


def cmd_tune_job(args: argparse.Namespace, settings: TuneSettings) -> int:
    """--job / --pending: each task with `settings` and its own budget, strategy and seed."""
    from rich.console import Console

    from autotune import jobs
    from autotune.db import TuningDB
    from autotune.progress import Display

    if args.job and args.pending:
        raise UsageError("give --job FILE or --pending, not both")
    if args.kernel or args.shape:
        raise UsageError(
            "--job and --pending take their kernels and shapes from the file or the misses: "
            "drop the kernel and --shape (with --pending, --kernel K picks one kernel)"
        )
    shard = jobs.parse_shard(args.shard) if args.shard else None
    tasks = jobs.load_job(args.job) if args.job else []  # every task checked before the database
    with TuningDB(args.db) as db:
        if args.pending:
            tasks, unknown = jobs.pending_tasks(db, kernel=args.only_kernel, trials=args.trials)
            for name, count in unknown.items():
                print(
                    f"skipped {count} pending miss(es) of kernel {name!r}: not registered here "
                    "(name the module that registers it with --import MODULE)"
                )
        if shard:
            tasks = jobs.shard(tasks, *shard)
        storage = args.storage or jobs.default_storage(db.url)
        console = Console(highlight=False)
        console.print(
            f"{len(tasks)} task(s); database {db.url}; studies {storage or 'in memory'}",
            markup=False,
            soft_wrap=True,
        )
        with Display(console) as display:
            # --time-limit and --patience bound one tuning, not a job's tasks: their budget is
            # the job file's (or --trials with --pending)
            run = settings.replace(storage=storage, time_limit_s=None, patience=None)
            outcomes = jobs.run_tasks(tasks, db=db, settings=run, force=args.force, show=display)
    counts = {s: sum(o.status == s for o in outcomes) for s in ("tuned", "skipped", "failed")}
    print(", ".join(f"{n} {s}" for s, n in counts.items()))
    return 1 if counts["failed"] else 0


def cmd_report(args: argparse.Namespace) -> int:
    from autotune import report
    from autotune.db import TuningDB

    report.check_out(args.out)
    cli_db.check_arguments(args)
    with TuningDB(args.db) as db:
        index, pngs = report.write(db, args.out, kernel=args.kernel)
    print(f"wrote {index}" + (f" and {len(pngs)} PNG files" if pngs else ""))
    return 0


COMMANDS = {
    "tune": cmd_tune,
    "check": cmd_check,
    "report": cmd_report,
    "kernels": cmd_kernels,
    "db": cmd_db,
}


def render(rows: list[dict[str, Any]], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(rows, indent=2, default=str)
    if fmt == "csv":
        buf = io.StringIO()
        if rows:
            w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
            w.writeheader()
            for r in rows:
                w.writerow(
                    {
                        k: json.dumps(v, sort_keys=True) if isinstance(v, dict) else v
                        for k, v in r.items()
                    }
                )
        return buf.getvalue().rstrip("\n")
    return _table([_table_row(r) for r in rows]) if rows else "(no rows)"


_TABLE_COLUMNS = (
    "id",
    "kernel",
    "device_kind",
    "signature",
    "static",
    "status",
    "oracle",  # trials: which oracle judged it
    "config",
    "time_s",
    "default_time_s",
    "speedup",
    "n_trials",
    "n_rejected",
    # db stats
    "entries",
    "trials",
    "misses",
    "median_speedup",
    "max_speedup",
)


def _table_row(r: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k in _TABLE_COLUMNS:
        if k not in r or (k == "static" and r[k] == "{}"):
            continue
        v = r[k]
        if k == "config":
            v = _config_text(v) if isinstance(v, dict) else str(v)
        elif k.endswith("time_s"):
            k, v = k.replace("_s", "_ms"), None if v is None else f"{v * 1e3:.4f}"
        elif k.endswith("speedup") and v is not None:
            v = f"{v:.2f}x"
        out[k] = "" if v is None else v
    return out


def _config_text(config: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(config.items()))


def _table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(no rows)"
    cols = list(dict.fromkeys(k for r in rows for k in r))
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols}
    lines = ["  ".join(c.ljust(widths[c]) for c in cols)]
    lines += ["  ".join(str(r.get(c, "")).ljust(widths[c]) for c in cols) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


if __name__ == "__main__":
    sys.exit(main())
