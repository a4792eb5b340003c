"""`autotune db show|export|import|merge|stale|prune|stats`: the tuning database as a tool.

(`db list`, `db trials` and `db misses` live in cli.py; these are in their own module so that
cli.py stays small.)
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.db import PREFER, TuningDB, validate_export
from autotune.errors import AutotuneError

FORMATS = ("table", "json", "csv")


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
    (read here: `args.doc`), a URL whose kind or driver is unknown."""
    from autotune.db import check_url
    from autotune.signature import parse_dtype

    if getattr(args, "dtype", None) is not None:
        args.dtype = parse_dtype(args.dtype)
    if getattr(args, "id", None) is not None and not 1 <= args.id <= MAX_ID:
        raise AutotuneError(f"no entry with id {args.id}: see `autotune db list` for the ids")
    if getattr(args, "file", None) is not None:
        args.doc = _read_export(args.file)
        try:
            validate_export(args.doc)
        except AutotuneError as e:
            raise AutotuneError(f"{args.file}: {e}; nothing was imported") from None
    for what in ("db", "url"):
        if getattr(args, what, None) is not None:
            check_url(getattr(args, what), "--db" if what == "db" else "the database")


def _read_export(file: str) -> Any:
    try:
        return json.loads(Path(file).read_text())
    except OSError as e:
        raise AutotuneError(f"cannot read {file}: {e.strerror or e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise AutotuneError(f"{file} is not JSON ({e}): give a file from `db export`") from None


def add_parsers(dsub: Any) -> None:
    """Add the tool subcommands to `autotune db`'s subparsers."""
    q = dsub.add_parser("show", help="one best entry with all its trials")
    q.add_argument("id", type=int, help="the entry's id (see `autotune db list`)")
    q.add_argument("--format", choices=FORMATS, default="table")

    q = dsub.add_parser("export", help="best entries as a portable JSON file")
    _filters(q)
    q.add_argument("--out", default="-", help="file to write (default: standard output)")

    q = dsub.add_parser("import", help="add the entries of an exported JSON file")
    q.add_argument("file")
    q.add_argument("--prefer", choices=PREFER, default="faster", help="on a key conflict")

    q = dsub.add_parser("merge", help="add the best entries of another database")
    q.add_argument("url", help="SQLAlchemy URL or file of the other database")
    _filters(q)
    q.add_argument("--prefer", choices=PREFER, default="faster", help="on a key conflict")

    q = dsub.add_parser("stale", help="entries tuned for an older version of their kernel")
    _filters(q)
    q.add_argument("--format", choices=FORMATS, default="table")

    q = dsub.add_parser(
        "prune", help="delete stale entries (with their trials) and misses tuned since"
    )
    _filters(q)
    q.add_argument("--dry-run", action="store_true", help="say what would go, delete nothing")

    q = dsub.add_parser("stats", help="entries, trials, misses and speedups per kernel and device")
    _filters(q)
    q.add_argument("--format", choices=FORMATS, default="table")
    for p in dsub.choices.values():
        if not any(a.dest == "db" for a in p._actions):
            p.add_argument("--db", default=None, help="SQLAlchemy URL or file")


def cmd_show(args: argparse.Namespace, db: TuningDB, render: Callable) -> int:
    entry = db.entry(args.id)
    if entry is None:
        raise AutotuneError(f"no entry with id {args.id}: see `autotune db list` for the ids")
    trials = entry.pop("trials")
    if args.format == "json":
        print(json.dumps({**entry, "trials": trials}, indent=2, default=str))
        return 0
    print(render([entry], args.format))
    print()
    print(render(trials, args.format))
    return 0


def cmd_export(args: argparse.Namespace, db: TuningDB, render: Callable) -> int:
    doc = db.export(**_filter_values(args))
    text = json.dumps(doc, indent=2, sort_keys=True, default=str)
    if args.out == "-":
        print(text)
    else:
        Path(args.out).write_text(text + "\n")
        print(f"exported {len(doc['entries'])} entries to {args.out}")
    return 0


def cmd_import(args: argparse.Namespace, db: TuningDB, render: Callable) -> int:
    try:
        counts = db.import_entries(args.doc, prefer=args.prefer)
    except AutotuneError as e:
        raise AutotuneError(f"{args.file}: {e}; nothing was imported") from None
    print(_counts(counts))
    return 0


def cmd_merge(args: argparse.Namespace, db: TuningDB, render: Callable) -> int:
    with TuningDB(args.url) as other:
        doc = other.export(**_filter_values(args))
    print(_counts(db.import_entries(doc, prefer=args.prefer)))
    return 0


def stale_entries(db: TuningDB, filters: dict[str, Any]) -> list[dict[str, Any]]:
    """Entries of registered kernels whose kernel version is not the current one."""
    from autotune.registry import registered

    current = {name: k.spec.version for name, k in registered().items()}
    rows = db.query(**filters)
    return [
        {**r, "current_version": current[r["kernel"]]}
        for r in rows
        if r["kernel"] in current and r["kernel_version"] != current[r["kernel"]]
    ]


def cmd_stale(args: argparse.Namespace, db: TuningDB, render: Callable) -> int:
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


def cmd_prune(args: argparse.Namespace, db: TuningDB, render: Callable) -> int:
    filters = _filter_values(args)
    stale = stale_entries(db, dict(filters))
    tuned = {_key(r) for r in db.query(**dict(filters))}
    answered = [m for m in db.misses(**dict(filters)) if _key(m) in tuned]
    if args.dry_run:
        print(f"would delete {len(stale)} stale entries and {len(answered)} answered misses")
        return 0
    n = db.delete_entries(r["id"] for r in stale)
    m = db.delete_misses(r["id"] for r in answered)
    print(f"deleted {n} stale entries (with their trials) and {m} answered misses")
    return 0


def cmd_stats(args: argparse.Namespace, db: TuningDB, render: Callable) -> int:
    filters = _filter_values(args)
    groups: dict[tuple, dict[str, Any]] = {}

    def group(r: dict[str, Any]) -> dict[str, Any]:
        g = (r["kernel"], r["device_kind"])
        return groups.setdefault(
            g,
            {"kernel": g[0], "device_kind": g[1], "entries": 0, "trials": 0, "misses": 0, "sp": []},
        )

    for r in db.query(**dict(filters)):
        group(r)["entries"] += 1
        if r["speedup"]:
            group(r)["sp"].append(r["speedup"])
    for r in db.trials(**dict(filters)):
        group(r)["trials"] += 1
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


def _key(r: dict[str, Any]) -> tuple:
    from autotune.db import KEY_COLUMNS

    return tuple(r[k] for k in KEY_COLUMNS)


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {what}" for what, n in counts.items())


COMMANDS = {
    "show": cmd_show,
    "export": cmd_export,
    "import": cmd_import,
    "merge": cmd_merge,
    "stale": cmd_stale,
    "prune": cmd_prune,
    "stats": cmd_stats,
}
