"""Exported tuning databases: the portable document of best entries and its validation (a
database merges one in: autotune.db.admin; a shipped table or an overlay reads one:
autotune.db.tables), and the checks of an entry's fields that `autotune db check` makes of a
database's rows too (field_problems): one set of rules for what an entry may hold."""

from __future__ import annotations

import datetime
import math
from collections.abc import Mapping
from typing import Any

from sqlalchemy import String

from autotune import backends
from autotune.backends import PLATFORM_BACKENDS
from autotune.backends.platforms import PLATFORMS
from autotune.db.schema import KEY_COLUMNS, SCHEMA_VERSION, Result
from autotune.errors import AutotuneError, DatabaseError
from autotune.signature import parse_args, parse_static

EXPORT_FORMAT = "pallas-autotune-export"
# which of two entries of one key an import keeps: the faster, or the more recently tuned
PREFER = ("faster", "newer")

TIMES = ("time_s", "default_time_s", "speedup")  # positive numbers; only time_s is required
COUNTS = ("n_trials", "n_rejected")
# PostgreSQL's INTEGER, which refuses more; SQLite would take it, and both databases must hold
# what either holds
COUNT_MAX = 2**31 - 1
# A config is a handful of parameters: one this long is no configuration (and every lookup
# would parse it)
CONFIG_CHARS = 4096
_REQUIRED = (*KEY_COLUMNS, "config", "time_s", "n_trials", "n_rejected")
_COLUMNS = frozenset(Result.__table__.columns.keys())
# the text columns and their lengths, which PostgreSQL enforces and SQLite does not
_LENGTHS = {
    c.name: c.type.length
    for c in Result.__table__.columns
    if isinstance(c.type, String) and c.type.length
}


def validate_export(doc: Any) -> list[dict[str, Any]]:
    """The entries of an exported document, or a DatabaseError naming what is wrong."""
    entries = export_entries(doc)
    for n, e in enumerate(entries, 1):
        validate_entry(e, n)
    return entries


def export_entries(doc: Any) -> list[Any]:
    """The list of entries of an exported document, each unchecked (validate_entry)."""
    if not isinstance(doc, dict) or doc.get("format") != EXPORT_FORMAT:
        raise DatabaseError(f'not a pallas-autotune export (no "format": "{EXPORT_FORMAT}")')
    schema = doc.get("schema")
    readable = isinstance(schema, int) and not isinstance(schema, bool)
    if not readable or not 1 <= schema <= SCHEMA_VERSION:
        said = "no" if schema is None else f"{_shown(schema)} as its"
        raise DatabaseError(
            f'the export has {said} "schema" version, and this pallas-autotune reads 1 to '
            f"{SCHEMA_VERSION}: export it again with `autotune db export`"
        )
    entries = doc.get("entries")
    if not isinstance(entries, list):
        raise DatabaseError('export has no list of "entries"')
    return entries


def validate_entry(e: Any, n: int) -> None:
    """A DatabaseError naming entry `n` (from 1) of an export and its first field that is
    wrong, if any."""
    if not isinstance(e, dict):
        raise DatabaseError(f"export entry {n} is not an object")
    where = f"export entry {n}"
    if isinstance(e.get("kernel"), str) and isinstance(e.get("signature"), str):
        where += f" ({_text(e['kernel'])} {_text(e['signature'])})"
    missing = [k for k in _REQUIRED if k not in e]
    if missing:
        raise DatabaseError(f"{where}: field(s) {', '.join(missing)} missing")
    bad = sorted(_text(str(k)) for k in e if k not in _COLUMNS)
    if bad:
        raise DatabaseError(f"{where}: unknown field(s) {', '.join(bad)}")
    problems = field_problems(e)
    if problems:
        raise DatabaseError(f"{where}: {problems[0]}")


def field_problems(e: Mapping[str, Any]) -> list[str]:
    """What is wrong with the fields an entry holds (an export's entry, or a database row as
    `db check` reads it, its config decoded), one sentence each naming the field; a field it
    leaves out is not looked at. Whether its config is one of its kernel's space is asked of
    the kernel (autotune.db.check)."""
    problems = []
    for name, length in _LENGTHS.items():
        if name not in e:
            continue
        value = e[name]
        if not isinstance(value, str) or (name in KEY_COLUMNS and not value):
            problems.append(f"{name} {_shown(value)} is not {_a_string(name)}")
        elif len(value) > length:
            problems.append(
                f"{name} has {len(value)} characters, more than a database holds ({length})"
            )
    kernel = e.get("kernel")
    if isinstance(kernel, str) and ":" in kernel:
        # a registered name never has one; a tool resolving it would import a module
        problems.append(f"kernel {_shown(kernel)} is an import path, not a kernel's name")
    problems += _key_problems(e)
    for name in TIMES:
        if name in e and not (positive(e[name]) or (e[name] is None and name != "time_s")):
            problems.append(f"{name} {_shown(e[name])} is not a positive number")
    for name in COUNTS:
        value = e.get(name, 0)
        whole = isinstance(value, int) and not isinstance(value, bool)
        if not (whole and 0 <= value <= COUNT_MAX):
            problems.append(f"{name} {_shown(value)} is not a whole number from 0 to {COUNT_MAX}")
    if e.get("tuned_at") is not None and not is_time(e["tuned_at"]):
        problems.append(f"tuned_at {_shown(e['tuned_at'])} is not a date")
    if "config" in e:
        problem = config_problem(e["config"])
        if problem:
            problems.append(problem)
    return problems


def _key_problems(e: Mapping[str, Any]) -> list[str]:
    """Its platform, backend and device kind agree; its signature and static arguments read."""
    problems = []
    platform, backend, kind = e.get("platform"), e.get("backend"), e.get("device_kind")
    if platform is not None:
        if platform not in PLATFORMS:
            problems.append(f"unknown platform {_shown(platform)}")
        elif backend is not None and backend not in PLATFORM_BACKENDS[platform]:
            problems.append(f"backend {_shown(backend)} does not belong to platform {platform}")
        elif kind is not None and not str(kind).startswith(
            backends.of_platform(platform).kind_prefix
        ):
            problems.append(f"device kind {_shown(kind)} is not a {platform} device")
    try:
        if isinstance(e.get("signature"), str):
            parse_args(e["signature"])
        if isinstance(e.get("static"), str):
            parse_static(e["static"])
    except AutotuneError as err:
        problems.append(f"unreadable key: {err}")
    return problems


def config_problem(config: Any) -> str | None:
    """Why `config` is no configuration of any kernel: an object of parameter names to
    numbers, bools or strings (what a space holds), of a sensible size."""
    if not isinstance(config, dict):
        return f"config {_shown(config)} is not an object of parameters"
    for name, value in config.items():
        if not isinstance(name, str) or not name.isidentifier():
            return f"config parameter {_shown(name)} is not a parameter's name"
        bad_number = isinstance(value, float) and not math.isfinite(value)
        too_long = (isinstance(value, int) and abs(value) >= 2**63) or (
            isinstance(value, str) and len(value) > CONFIG_CHARS
        )
        if not isinstance(value, (bool, int, float, str)) or bad_number or too_long:
            return (
                f"config {name}={_shown(value)} is not a value a space holds (a finite "
                "number, a bool or a string)"
            )
    size = sum(len(name) + len(str(value)) for name, value in config.items())
    if size > CONFIG_CHARS:
        return (
            f"config has {size} characters of parameters, more than a configuration's "
            f"{CONFIG_CHARS}"
        )
    return None


def is_time(value: Any) -> bool:
    """Whether SQLAlchemy reads `value` as a timestamp (text in SQLite, a datetime elsewhere)."""
    if isinstance(value, datetime.datetime):
        return True
    try:
        datetime.datetime.fromisoformat(str(value))
    except ValueError:
        return False
    return True


def positive(value: Any) -> bool:
    """A positive number a float column holds (an infinite time is no measurement)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return 0 < float(value) < math.inf
    except OverflowError:  # an integer past a float's range
        return False


def _a_string(name: str) -> str:
    return "a non-empty string" if name in KEY_COLUMNS else "a string"


def _text(value: str, limit: int = 60) -> str:
    return value if len(value) <= limit else f"{value[:limit]}... ({len(value)} chars)"


def _shown(value: Any, limit: int = 60) -> str:
    """A value as a message shows it (its repr), fit for one line however large."""
    try:
        s = repr(value)
    except ValueError:  # an integer past Python's limit on digits
        return f"an integer of {value.bit_length()} bits"
    return s if len(s) <= limit else f"{s[:limit]}... ({len(s)} chars)"
