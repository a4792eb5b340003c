"""Exported tuning databases: the portable document of best entries and its validation (a
database merges one in: autotune.db.admin; a shipped table or an overlay reads one:
autotune.db.tables)."""

from __future__ import annotations

from typing import Any

from autotune.backends.platforms import PLATFORMS
from autotune.db.schema import KEY_COLUMNS, Result
from autotune.errors import DatabaseError, SignatureError
from autotune.signature import parse_args

EXPORT_FORMAT = "pallas-autotune-export"
# which of two entries of one key an import keeps: the faster, or the more recently tuned
PREFER = ("faster", "newer")


_EXPORT_TYPES = {
    **{k: str for k in KEY_COLUMNS},
    "config": dict,
    "time_s": (int, float),
    "n_trials": int,
    "n_rejected": int,
}
_COLUMNS = frozenset(Result.__table__.columns.keys())


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
    entries = doc.get("entries")
    if not isinstance(entries, list):
        raise DatabaseError('export has no list of "entries"')
    return entries


def validate_entry(e: Any, n: int) -> None:
    """A DatabaseError naming what is wrong with entry `n` (from 1) of an export, if anything."""
    if not isinstance(e, dict):
        raise DatabaseError(f"export entry {n} is not an object")
    for name, kind in _EXPORT_TYPES.items():
        if not isinstance(e.get(name), kind) or isinstance(e.get(name), bool):
            raise DatabaseError(f"export entry {n}: field {name!r} is missing or malformed")
    if not e["time_s"] > 0:
        raise DatabaseError(f"export entry {n}: time_s must be positive, got {e['time_s']}")
    if e["platform"] not in PLATFORMS:
        raise DatabaseError(f"export entry {n}: unknown platform {e['platform']!r}")
    try:
        parse_args(e["signature"])
    except SignatureError as err:
        raise DatabaseError(f"export entry {n}: {err}") from None
    bad = sorted(k for k in e if k not in _COLUMNS)
    if bad:
        raise DatabaseError(f"export entry {n}: unknown field(s) {', '.join(bad)}")
