"""Exported tuning databases: the portable document of best entries, its validation, and the
rule that merges it into a database on a key conflict."""

from __future__ import annotations

import functools
from datetime import datetime, timezone
from typing import Any

from sqlalchemy.orm import Session

from autotune.dbwrite import upsert_entry
from autotune.errors import DatabaseError, SignatureError
from autotune.platforms import PLATFORMS
from autotune.schema import KEY_COLUMNS, Result, encode_config, utcnow
from autotune.signature import parse_args

EXPORT_FORMAT = "pallas-autotune-export"


PREFER = ("faster", "newer")


_EXPORT_TYPES = {
    **{k: str for k in KEY_COLUMNS},
    "config": dict,
    "time_s": (int, float),
    "n_trials": int,
    "n_rejected": int,
}


def validate_export(doc: Any) -> list[dict[str, Any]]:
    """The entries of an exported document, or a DatabaseError naming what is wrong."""
    if not isinstance(doc, dict) or doc.get("format") != EXPORT_FORMAT:
        raise DatabaseError(f'not a pallas-autotune export (no "format": "{EXPORT_FORMAT}")')
    entries = doc.get("entries")
    if not isinstance(entries, list):
        raise DatabaseError('export has no list of "entries"')
    for n, e in enumerate(entries, 1):
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
        bad = sorted(k for k in e if k not in Result.__table__.columns)
        if bad:
            raise DatabaseError(f"export entry {n}: unknown field(s) {', '.join(bad)}")
    return entries


def _parse_time(text: Any) -> datetime:
    try:
        t = datetime.fromisoformat(str(text))
    except ValueError:
        return utcnow()
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def _worse(new: dict[str, Any], prefer: str, row: Result) -> bool:
    """Whether the stored `row` is to be kept over the entry `new`."""
    return not _better(new, row, prefer)


def _better(new: dict[str, Any], row: Result, prefer: str) -> bool:
    if prefer == "newer":
        if row.tuned_at is None:  # unreadable (tampered): any real date is newer
            return True
        old = row.tuned_at if row.tuned_at.tzinfo else row.tuned_at.replace(tzinfo=timezone.utc)
        return new["tuned_at"] > old
    return new["time_s"] < row.time_s


def merge_entries(s: Session, entries: list[dict[str, Any]], prefer: str) -> dict[str, int]:
    """Add validated entries in session `s`; on a key conflict keep the faster entry
    (prefer="faster") or the more recently tuned one (prefer="newer"). Returns the counts of
    entries added, replaced and kept. An entry's trials live in the other database: it points
    at none here."""
    counts = {"added": 0, "replaced": 0, "kept": 0}
    for e in entries:
        key = {k: e[k] for k in KEY_COLUMNS}
        fields = {
            k: v for k, v in e.items() if k in Result.__table__.columns and k not in (*key, "id")
        }
        fields.update(
            config=encode_config(e["config"]),
            tuned_at=_parse_time(e.get("tuned_at")),
            trial_id=None,
        )
        done, _ = upsert_entry(s, key, fields, keep=functools.partial(_worse, fields, prefer))
        counts[done] += 1
    return counts
