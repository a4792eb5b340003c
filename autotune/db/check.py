"""`autotune db check`: read a tuning database without writing to it and say, in words, what
the runtime would refuse or warn about."""

from __future__ import annotations

from typing import Any

from autotune.db.export import (
    TIMES,
    config_problem,
    field_problems,
    is_time,
    positive,
    validate_export,
)
from autotune.db.schema import (
    KEY_COLUMNS,
    SCHEMA_VERSION,
    decode_config,
    encode_config,
    table_names,
)
from autotune.errors import AutotuneError, DatabaseError
from autotune.sql import normalize_url, sqlite_file, sqlite_reader
from autotune.trial import StoredEntry

# the columns read, by name: what the first released schema (v1) already had
RESULT_COLUMNS = ("id", *KEY_COLUMNS, "config", "trial_id", *TIMES, "tuned_at")
TRIAL_COLUMNS = ("id", *KEY_COLUMNS, "config", "status", "time_s", "created_at")


def check_database(url: Any) -> tuple[list[str], dict[str, int], dict[str, int]]:
    """Problems found (one sentence each), row counts, and the entries per kernel not registered
    here, whose configs could not be checked; never writes to the database."""
    from sqlalchemy import create_engine, func, inspect, select, table, text

    url = normalize_url(url)
    file = sqlite_file(url)
    if file is not None:
        if not file.is_file():
            return [f"{file} does not exist or is not a file"], {}, {}
        engine = sqlite_reader(file)  # a check must not create, migrate or repair anything
    else:
        engine = create_engine(url)
    problems: list[str] = []
    counts: dict[str, int] = {}
    try:
        with engine.connect() as conn:
            if file is not None:
                verdict = [r[0] for r in conn.exec_driver_sql("PRAGMA integrity_check")]
                if verdict != ["ok"]:
                    problems.append(f"SQLite integrity check failed: {'; '.join(verdict[:5])}")
            tables = set(inspect(conn).get_table_names())
            if "schema_info" not in tables:
                return problems + ["not a tuning database: no table schema_info"], {}, {}
            version = conn.execute(text("SELECT version FROM schema_info WHERE id = 1")).scalar()
            if version is not None and not isinstance(version, int):
                return (
                    problems
                    + [
                        f"schema_info's version {_text(version)!r} is not a number: the tools and "
                        "the runtime refuse the database; restore it from a copy"
                    ],
                    {},
                    {},
                )
            if version is not None and version > SCHEMA_VERSION:
                return (
                    problems
                    + [
                        f"schema v{version} is newer than this pallas-autotune (v{SCHEMA_VERSION}): "
                        "the runtime will not use it; upgrade pallas-autotune"
                    ],
                    {},
                    {},
                )
            if version is None:
                problems.append("schema_info has no version row")
            # an older schema is read as it is: upgrading it is a write, left to the runtime
            names = table_names(version or SCHEMA_VERSION)
            missing = set(names.values()) - tables
            if missing:
                return (
                    problems + [f"not a tuning database: no table(s) {', '.join(sorted(missing))}"],
                    {},
                    {},
                )
            results = _rows(conn, names["results"], RESULT_COLUMNS)
            trials = {r["id"]: r for r in _rows(conn, names["trials"], TRIAL_COLUMNS)}
            misses = select(func.count()).select_from(table(names["misses"]))
            counts = {
                "results": len(results),
                "trials": len(trials),
                "misses": conn.execute(misses).scalar() or 0,
            }
    except Exception as e:  # a corrupt file fails anywhere above
        reason = str(getattr(e, "orig", None) or e).splitlines()[0]
        return problems + [f"cannot read the database: {reason}"], counts, {}
    finally:
        engine.dispose()
    # entries without trials came from another database (db import, db merge): valid, and
    # counted so that the report says where they came from
    counts["entries imported without trials"] = sum(r["trial_id"] is None for r in results)
    from autotune import registry

    known = registry.registered()
    unknown: dict[str, int] = {}
    for r in results:
        if r["kernel"] not in known:  # its config checked against nothing: said apart
            unknown[_text(r["kernel"])] = unknown.get(_text(r["kernel"]), 0) + 1
        where = f"best entry {r['id']} ({_text(r['kernel'])} {_text(r['signature'])} on {_text(r['device_kind'])})"
        problems += [f"{where}: {p}" for p in _entry_problems(r, trials)]
    for t in trials.values():
        problems += [f"trial {t['id']}: {p}" for p in _trial_problems(t)]
    return problems, counts, unknown


def _trial_problems(t: dict[str, Any]) -> list[str]:
    """What the tools that read trials would skip (reports, landscapes, finalists)."""
    from autotune import registry

    problems = []
    if not (t["time_s"] is None or positive(t["time_s"])):
        problems.append(f"time_s {_text(t['time_s'])!r} is not a positive number")
    if not is_time(t["created_at"]):
        problems.append(f"created_at {_text(t['created_at'])!r} is not a date")
    config = decode_config(t["config"])
    kernel = registry.registered().get(t["kernel"])
    if not isinstance(config, dict):
        problems.append(f"config {_text(t['config'])!r} is not an object of parameters")
    elif (
        kernel is not None
        and t["kernel_version"] == kernel.spec.version  # an older version had its own space
        and t["platform"] in kernel.spec.spaces
    ):
        missing = sorted(set(kernel.spec.space(t["platform"]).names) - set(config))
        if missing:
            problems.append(f"config lacks {', '.join(missing)}")
    return problems


def tampered(r: dict[str, Any], trial: bool) -> str | None:
    """What makes a row, as `TuningDB` reads it (an unreadable date as None, the config
    decoded), unreadable to the tools, naming the row; None if nothing. `db check` finds each
    of these from the raw columns (`_entry_problems`, `_trial_problems`)."""
    from autotune import registry

    stamp = "created_at" if trial else "tuned_at"
    where = f"{'trial' if trial else 'best entry'} {r['id']} ({_text(r['kernel'])} {_text(r['signature'])} on {_text(r['device_kind'])})"
    if r[stamp] is None:
        return f"{where}: its {stamp} is not a date"
    config = r["config"]
    if not isinstance(config, dict):
        return f"{where}: its config is not an object of parameters"
    kernel = registry.registered().get(r["kernel"])
    # a trial of another version of its kernel may hold another space's parameters
    current = kernel is not None and r["kernel_version"] == kernel.spec.version
    if trial and current and r["platform"] in kernel.spec.spaces:
        missing = sorted(set(kernel.spec.space(r["platform"]).names) - set(config))
        if missing:
            return f"{where}: its config lacks {', '.join(missing)}"
    return None


def _rows(conn: Any, table: str, columns: tuple[str, ...]) -> list[dict[str, Any]]:
    from sqlalchemy import column, select
    from sqlalchemy import table as table_

    stmt = select(*map(column, columns)).select_from(table_(table)).order_by(column("id"))
    return [dict(zip(columns, row)) for row in conn.execute(stmt)]


def _text(value: Any, limit: int = 60) -> str:
    s = str(value)
    return s if len(s) <= limit else f"{s[:limit]}... ({len(s)} chars)"


def _entry_problems(r: dict[str, Any], trials: dict[int, dict[str, Any]]) -> list[str]:
    """Why the runtime would not serve this best entry (or would not trust where it came from);
    an entry of a kernel not registered here is checked but for its config (check_database
    says which kernels)."""
    return served_problems(r, unknown_kernel=False) + _entry_trial_problems(r, trials)


def served_problems(r: dict[str, Any], unknown_kernel: bool = True) -> list[str]:
    """Why the runtime would not serve this entry (a database row or a shipped entry): its
    times, its key, its kernel's version, its config in the kernel's space and constraints;
    a kernel not registered here is a problem unless not `unknown_kernel`."""
    from autotune import registry

    entry = {**r, "config": decode_config(r["config"])}
    # what an import refuses (autotune.db.export), the config said as the runtime says it
    problems = field_problems({k: v for k, v in entry.items() if k != "config"})
    config = entry["config"]
    problem = "config is not valid JSON" if config is None else config_problem(config)
    kernel = registry.registered().get(r["kernel"])
    if kernel is None:
        if unknown_kernel:
            problems.append("kernel is not registered here: its config was not validated")
    elif r["kernel_version"] != kernel.spec.version:
        problems.append(
            f"stale: tuned for kernel version {_text(r['kernel_version'])}, the kernel is now "
            f"{kernel.spec.version}; not served: re-tune it"
        )
    elif not problems and problem is None:
        problem = space_problem(kernel, entry)
    if problem:
        problems.append(f"config not served: {problem}")
    return problems


def space_problem(kernel: Any, e: dict[str, Any]) -> str | None:
    """Why entry `e` (its fields sound: field_problems) holds no config of `kernel`'s space on
    its platform that its own shape admits; None where it does, or where the kernel has no
    space there."""
    from autotune.signature import Signature, parse_args, parse_static

    if e["platform"] not in kernel.spec.spaces:
        return None
    space = kernel.spec.space(e["platform"])
    problem = space.check_stored(e["config"])
    if problem is None:
        args, static = parse_args(e["signature"]), parse_static(e["static"])
        sig = Signature(args, static, e["platform"], str(e["device_kind"]))
        broken = space.violations(e["config"], sig)
        problem = f"breaks {', '.join(broken)} for its own shape" if broken else None
    return problem


def validate_import(doc: Any) -> list[dict[str, Any]]:
    """The entries of an export document an import takes, or a DatabaseError naming the entry
    and its field: what an export's own checks refuse (validate_export), and a config that its
    kernel, registered here at the entry's version, would not serve. Entries of kernels not
    registered here, or of other versions, are taken as they are (`db check` says them apart)."""
    from autotune import registry

    entries = validate_export(doc)
    known = registry.registered()
    for n, e in enumerate(entries, 1):
        kernel = known.get(e["kernel"])
        if kernel is not None and e["kernel_version"] == kernel.spec.version:
            problem = space_problem(kernel, e)
            if problem:
                where = f"export entry {n} ({_text(e['kernel'])} {_text(e['signature'])})"
                raise DatabaseError(f"{where}: config not served: {problem}")
    return entries


def _entry_trial_problems(r: dict[str, Any], trials: dict[int, dict[str, Any]]) -> list[str]:
    problems: list[str] = []
    if r["trial_id"] is None:  # imported or merged: its trials stayed in the other database
        return problems
    trial = trials.get(r["trial_id"])
    if trial is None:
        problems.append(f"points at trial {r['trial_id']}, which does not exist")
    elif trial["status"] != "ok":
        problems.append(f"points at trial {r['trial_id']} of status {trial['status']!r}")
    elif any(trial[k] != r[k] for k in KEY_COLUMNS):
        problems.append(f"points at trial {r['trial_id']} of another key")
    elif decode_config(trial["config"]) != decode_config(r["config"]):
        problems.append(f"config differs from that of its trial {r['trial_id']}")
    return problems


def format_report(url: str, problems: list[str], counts: dict[str, int]) -> str:
    summary = ", ".join(f"{n} {name}" for name, n in counts.items())
    head = f"{url}: {summary}" if summary else url
    if not problems:
        return f"{head}: no problems found"
    lines = [f"{head}: {len(problems)} problem(s)"] + [f"  - {p}" for p in problems]
    return "\n".join(lines)


def format_unchecked(unknown: dict[str, int], imports: list[str]) -> str:
    """The line saying which kernels' entries were not checked against their kernel, and why."""
    kernels = ", ".join(
        f"{name} ({n} entr{'y' if n == 1 else 'ies'})" for name, n in sorted(unknown.items())
    )
    why = (
        f"not registered by --import {' '.join(imports)}"
        if imports
        else "not registered here (not shipped; no --import)"
    )
    return (
        f"not checked against their kernel: {kernels}: {why}; pass --import MODULE, the "
        "module that defines them, to check their configs"
    )


def shipped_entries(kernel: str | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """The entries of the tables shipped with the registered kernels (`tuned=`), or with
    `kernel` only, each with `table` (its path) and `problems` (why the runtime would not serve
    it); and a sentence per table that cannot be read."""
    from autotune import registry
    from autotune.db.tables import shipped_table

    rows: list[dict[str, Any]] = []
    unreadable: list[str] = []
    for name, k in registry.registered().items():
        if k.spec.tuned is None or kernel not in (None, name):
            continue
        try:
            table = shipped_table(k.spec.tuned)
            entries = table.entries
        except AutotuneError as e:
            unreadable.append(str(e))
            continue
        for e in map(StoredEntry.as_row, entries):
            row = {**{t: e.get(t) for t in TIMES}, **e, "config": encode_config(e["config"])}
            problems = served_problems(row)
            if e["kernel"] != name:
                problems.insert(0, f"is for kernel {_text(e['kernel'])}, not {name}: never served")
            rows.append({**e, "table": str(table.where), "problems": problems})
    return rows, unreadable


def check_shipped() -> tuple[list[str], int]:
    """Problems of the tables shipped with the registered kernels, and how many entries they
    hold."""
    rows, problems = shipped_entries()
    for r in rows:
        where = f"{r['table']}: {_text(r['kernel'])} {_text(r['signature'])} on {_text(r['device_kind'])}"
        problems += [f"{where}: {p}" for p in r["problems"]]
    return problems, len(rows)
