"""`autotune db ...`: every subcommand of the tuning database as a tool.

Each takes --db; all but `check` have their arguments checked before the database is opened
(so that a bad one creates nothing), then run with it open.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune import registry
from autotune.backends.platforms import PLATFORMS
from autotune.cli.common import (
    DB_HELP,
    Parser,
    UsageError,
    add_import_argument,
    import_user_modules,
)
from autotune.cli.output import FORMATS, render
from autotune.db import TuningDB
from autotune.db.export import PREFER
from autotune.db.schema import KEY_COLUMNS
from autotune.errors import AutotuneError
from autotune.sql import check_url, default_db_path, normalize_url, not_tuned_yet, sqlite_file


def _filters(q: argparse.ArgumentParser) -> None:
    q.add_argument("--kernel")
    q.add_argument("--device-kind")
    q.add_argument("--platform")
    q.add_argument("--dtype")


def _filter_values(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "kernel": args.kernel,
        "device_kind": args.device_kind,
        "platform": args.platform,
        "dtype": args.dtype,
    }


MAX_ID = 2**63 - 1  # ids are 64-bit integers in every database


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse bad arguments before the database is opened, so that nothing is created: an
    unknown dtype filter, an id no database can hold, an import file that is not an export
    (read here: `args.doc`), a URL whose kind or driver is unknown, a database to merge that
    does not exist (read here: `args.doc`)."""
    from autotune.db.check import validate_import
    from autotune.signature import parse_dtype

    if getattr(args, "dtype", None) is not None:
        args.dtype = parse_dtype(args.dtype)
    if getattr(args, "platform", None) not in (None, *PLATFORMS):
        raise AutotuneError(
            f"unknown --platform {args.platform!r}: give one of {', '.join(PLATFORMS)}"
        )
    if getattr(args, "id", None) is not None and not 1 <= args.id <= MAX_ID:
        raise AutotuneError(f"no entry with id {args.id}: see `autotune db list` for the ids")
    if getattr(args, "file", None) is not None:
        args.doc = _read_export(args.file)
        try:
            validate_import(args.doc)
        except AutotuneError as e:
            raise AutotuneError(f"{args.file}: {e}; nothing was imported") from None
    for what in ("db", "url"):
        if getattr(args, what, None) is not None:
            check_url(getattr(args, what), "--db" if what == "db" else "the database")
    if getattr(args, "url", None) is not None:  # `db merge`: its source, read first
        with TuningDB(args.url, create=False, skip_tampered=True) as other:
            args.doc = other.export(**_filter_values(args))


def _read_export(file: str) -> Any:
    try:
        return json.loads(Path(file).read_text())
    except OSError as e:
        raise AutotuneError(f"cannot read {file}: {e.strerror or e}") from None
    except (UnicodeDecodeError, ValueError) as e:  # ValueError: JSON's, or a number too long
        raise AutotuneError(f"{file} is not JSON ({e}): give a file from `db export`") from None
    except RecursionError:  # json recurses into nested arrays and objects
        raise AutotuneError(f"{file} is nested too deeply: give a file from `db export`") from None


def add_parser(sub: Any) -> None:
    d = sub.add_parser("db", help="query the tuning database")
    dsub = d.add_subparsers(dest="db_command", required=True, parser_class=Parser)
    for name, help_ in (
        ("list", "best entries"),
        ("trials", "every measured trial"),
        ("misses", "lookups model code made that the database could not answer"),
    ):
        run = cmd_list if name == "list" else _opened(cmd_query, listing=True)
        q = _subcommand(dsub, name, help_, run)
        _filters(q)
        q.add_argument("--format", choices=FORMATS, default="table")
        if name == "list":
            q.add_argument(
                "--shipped",
                action="store_true",
                help="the entries of the tables shipped with the kernels (tuned=), not the database's",
            )
            add_import_argument(q)
        if name == "misses":
            q.add_argument(
                "--signature", help="only the misses of this call signature, e.g. f32[64,128]"
            )
            q.add_argument(
                "--delete",
                action="store_true",
                help="delete the misses listed (those of the filters)",
            )

    q = _subcommand(
        dsub, "check", "report, in words, every problem the runtime would meet", cmd_check
    )
    add_import_argument(q)

    q = _subcommand(dsub, "show", "one best entry with all its trials", _opened(cmd_show))
    q.add_argument("id", type=int, help="the entry's id (see `autotune db list`)")
    q.add_argument("--format", choices=FORMATS, default="table")

    q = _subcommand(dsub, "export", "best entries as a portable JSON file", _opened(cmd_export))
    _filters(q)
    q.add_argument("--out", default="-", help="file to write (default: standard output)")
    q.add_argument(
        "--format",
        choices=("json", "jax"),
        default="json",
        help="json (default: `db import` reads it), or jax: the Python module of the table the "
        "kernel's own project keeps by hand (JAX's tuned_block_sizes.py), for one --kernel",
    )

    q = _subcommand(
        dsub, "import", "add the entries of an exported JSON file", _opened(cmd_import, create=True)
    )
    q.add_argument("file")
    q.add_argument("--prefer", choices=PREFER, default="faster", help="on a key conflict")

    q = _subcommand(
        dsub, "merge", "add the best entries of another database", _opened(cmd_merge, create=True)
    )
    q.add_argument("url", help="SQLAlchemy URL or file of the other database")
    _filters(q)
    q.add_argument("--prefer", choices=PREFER, default="faster", help="on a key conflict")

    q = _subcommand(
        dsub,
        "stale",
        "entries tuned for another version of their kernel",
        _opened(cmd_stale, listing=True),
    )
    _filters(q)
    q.add_argument("--format", choices=FORMATS, default="table")
    add_import_argument(q)

    q = _subcommand(
        dsub,
        "prune",
        "delete stale entries (with their trials) and misses tuned since",
        _opened(cmd_prune),
    )
    _filters(q)
    q.add_argument("--dry-run", action="store_true", help="say what would go, delete nothing")
    add_import_argument(q)

    q = _subcommand(
        dsub,
        "stats",
        "entries, trials, misses and speedups per kernel and device",
        _opened(cmd_stats, listing=True),
    )
    _filters(q)
    q.add_argument("--format", choices=FORMATS, default="table")

    q = _subcommand(
        dsub,
        "landscape",
        "write an exhaustive run's trials as a landscape CSV (for replay)",
        _opened(cmd_landscape),
    )
    q.add_argument("--kernel", required=True)
    q.add_argument("--signature", required=True, help="e.g. f32[64,128]")
    q.add_argument("--device-kind")
    q.add_argument("--output", "-o", help="file to write (.csv, or .csv.gz); default: stdout")


def _subcommand(
    dsub: Any, name: str, help_: str, run: Callable[[argparse.Namespace], int]
) -> argparse.ArgumentParser:
    """A `db` subcommand: every one takes --db."""
    q = dsub.add_parser(name, help=help_)
    q.add_argument("--db", default=None, help=DB_HELP)
    q.set_defaults(run=run)
    return q


def _opened(
    command: Callable[[argparse.Namespace, TuningDB], int],
    create: bool = False,
    listing: bool = False,
) -> Callable[[argparse.Namespace], int]:
    """`command` run with the database open, once the user's kernels are registered and the
    arguments checked: nothing is created for a command line that cannot run, nor for one
    that only reads or deletes (only `create` commands, which add entries, create one). A
    `listing` before anything is tuned (no per-user database yet) says so, and succeeds."""

    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        import_user_modules(args)
        check_arguments(args)
        file = sqlite_file(normalize_url(args.db))
        if listing and file == default_db_path() and not file.exists():
            print(not_tuned_yet(file))
            return 0
        with TuningDB(args.db, create=create, skip_tampered=True) as db:
            return command(args, db)

    return run


def cmd_query(args: argparse.Namespace, db: TuningDB) -> int:
    """`db list`, `db trials`, `db misses` (--delete: the misses listed)."""
    if args.db_command == "misses":
        rows = db.misses(**_filter_values(args), signature=args.signature)
        if args.delete:
            given = _given({**_filter_values(args), "signature": args.signature})
            if given and not rows:  # a misspelt filter: "deleted 0" would pass for done
                raise AutotuneError(
                    f"no misses match {given}: nothing deleted (see `autotune db misses`)"
                )
            print(f"deleted {db.delete_misses(r['id'] for r in rows)} miss(es)")
            return 0
    else:
        read = {"list": db.query, "trials": db.trials}[args.db_command]
        rows = [r.as_row() for r in read(**_filter_values(args))]
    print(render(rows, args.format))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    """`db list`: the database's best entries, or with --shipped the shipped tables'."""
    if not args.shipped:
        return _opened(cmd_query, listing=True)(args)
    import_user_modules(args)
    check_arguments(args)
    rows, unreadable = shipped_entries(_filter_values(args))
    print(render(rows, args.format))
    for problem in unreadable:  # the other tables' entries are listed all the same
        print(f"autotune: {problem}", file=sys.stderr)
    return 1 if unreadable else 0


def shipped_entries(filters: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """The shipped tables' entries that match `filters`, each with `served`: "yes", or why the
    runtime would not serve it; and a sentence per table that cannot be read."""
    from autotune.db.check import shipped_entries as entries
    from autotune.signature import parse_args, short_dtype

    rows, unreadable = entries(filters.pop("kernel"))
    dtype = filters.pop("dtype")
    out = []
    for r in rows:
        if any(v is not None and r[k] != v for k, v in filters.items()):
            continue
        if dtype is not None and short_dtype(dtype) not in {
            short_dtype(a.dtype) for a in parse_args(r["signature"])
        }:
            continue
        problems = r.pop("problems")
        out.append({**r, "served": "; ".join(problems) or "yes"})
    return out, unreadable


def cmd_check(args: argparse.Namespace) -> int:
    """Exit 0 when the database and the shipped tables are sound, 1 when they have problems
    (each printed on a line). Entries of kernels not registered here are checked but for their
    configs, and said on a line of their own: not a problem."""
    from autotune.db.check import check_database, check_shipped, format_report, format_unchecked

    import_user_modules(args)
    url = normalize_url(args.db)
    problems, counts, unknown = check_database(url)
    print(format_report(url, problems, counts))
    if unknown:
        print(format_unchecked(unknown, args.imports))
    shipped, n = check_shipped()
    if shipped or n:
        print(format_report("shipped tables", shipped, {"entries": n}))
    return 1 if problems or shipped else 0


def cmd_show(args: argparse.Namespace, db: TuningDB) -> int:
    stored = db.entry(args.id)
    if stored is None:
        raise AutotuneError(f"no entry with id {args.id}: see `autotune db list` for the ids")
    entry = stored.as_row()
    trials = [t.as_row() for t in db.trials(**stored.key.as_dict())]
    if args.format == "json":
        print(json.dumps({**entry, "trials": trials}, indent=2, default=str))
        return 0
    print(render([entry], args.format))
    print()
    print(render(trials, args.format))
    return 0


def _given(filters: dict[str, Any]) -> str:
    """The filters given, as the flags that gave them ("" where none was)."""
    return ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in filters.items() if v)


def cmd_export(args: argparse.Namespace, db: TuningDB) -> int:
    filters = _filter_values(args)
    write = None
    if args.format == "jax":
        if not filters.get("kernel"):
            raise UsageError("--format jax writes one kernel's table: give --kernel NAME")
        write = registry.table_format(filters["kernel"])
    doc = db.export(**filters)
    given = _given(filters)
    if given and not doc["entries"]:  # a misspelt filter: an empty file would pass for an export
        raise AutotuneError(f"no entries match {given}: nothing exported (see `autotune db list`)")
    if write is not None:
        text = write(doc["entries"]).rstrip("\n")
    else:
        text = json.dumps(doc, indent=2, sort_keys=True, default=str)
    if args.out == "-":
        print(text)
    else:
        try:
            Path(args.out).write_text(text + "\n")
        except OSError as e:
            raise AutotuneError(
                f"--out {args.out}: cannot write it ({e.strerror or e}): give a file in a "
                "folder that exists and can be written"
            ) from None
        print(f"exported {len(doc['entries'])} entries to {args.out}")
    return 0


def cmd_import(args: argparse.Namespace, db: TuningDB) -> int:
    try:
        counts = db.import_entries(args.doc, prefer=args.prefer)
    except AutotuneError as e:
        raise AutotuneError(f"{args.file}: {e}; nothing was imported") from None
    print(_counts(counts))
    return 0


def cmd_merge(args: argparse.Namespace, db: TuningDB) -> int:
    print(_counts(db.import_entries(args.doc, prefer=args.prefer)))
    return 0


def stale_entries(db: TuningDB, filters: dict[str, Any]) -> list[dict[str, Any]]:
    """Entries of registered kernels whose kernel version is not the current one."""
    from autotune.registry import registered

    current = {name: k.spec.version for name, k in registered().items()}
    rows = [r.as_row() for r in db.query(**filters)]
    return [
        {**r, "current_version": current[r["kernel"]]}
        for r in rows
        if r["kernel"] in current and r["kernel_version"] != current[r["kernel"]]
    ]


def cmd_stale(args: argparse.Namespace, db: TuningDB) -> int:
    rows = stale_entries(db, _filter_values(args))
    if args.format == "table":
        rows = [
            {
                k: r[k]
                for k in (
                    "id",
                    "kernel",
                    "kernel_version",
                    "current_version",
                    "device_kind",
                    "signature",
                )
            }
            for r in rows
        ]
    print(render(rows, args.format))
    return 0


def cmd_prune(args: argparse.Namespace, db: TuningDB) -> int:
    filters = _filter_values(args)
    stale = stale_entries(db, dict(filters))
    tuned = {_key(r.key.as_dict()) for r in db.query(**dict(filters))}
    answered = [m for m in db.misses(**dict(filters)) if _key(m) in tuned]
    if args.dry_run:
        print(f"would delete {len(stale)} stale entries and {len(answered)} answered misses")
        return 0
    n = db.delete_entries(r["id"] for r in stale)
    m = db.delete_misses(r["id"] for r in answered)
    print(f"deleted {n} stale entries (with their trials) and {m} answered misses")
    return 0


def cmd_stats(args: argparse.Namespace, db: TuningDB) -> int:
    filters = _filter_values(args)
    groups: dict[tuple, dict[str, Any]] = {}

    def group(r: dict[str, Any]) -> dict[str, Any]:
        g = (r["kernel"], r["device_kind"])
        return groups.setdefault(
            g,
            {"kernel": g[0], "device_kind": g[1], "entries": 0, "trials": 0, "misses": 0, "sp": []},
        )

    for e in db.query(**dict(filters)):
        group(e.key.as_dict())["entries"] += 1
        if e.speedup:
            group(e.key.as_dict())["sp"].append(e.speedup)
    for t in db.trials(**dict(filters)):
        group(t.key.as_dict())["trials"] += 1
    for r in db.misses(**dict(filters)):
        group(r)["misses"] += 1
    rows = []
    for g in sorted(groups.values(), key=lambda g: (g["kernel"], g["device_kind"])):
        sp = g.pop("sp")
        g["median_speedup"] = round(statistics.median(sp), 3) if sp else None
        g["max_speedup"] = round(max(sp), 3) if sp else None
        rows.append(g)
    print(render(rows, args.format))
    return 0


def cmd_landscape(args: argparse.Namespace, db: TuningDB) -> int:
    from autotune.db.landscape import landscape_rows, write_landscape

    header, rows = landscape_rows(db, args.kernel, args.signature, args.device_kind)
    text = write_landscape(args.output, header, rows)
    if args.output is None:
        print(text, end="")
    else:
        print(f"wrote {len(rows)} configurations to {args.output}", file=sys.stderr)
    return 0


def _key(r: dict[str, Any]) -> tuple:
    return tuple(r[k] for k in KEY_COLUMNS)


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {what}" for what, n in counts.items())
