"""Administering a tuning database: exporting its entries, importing (merging) an export, and
deleting entries and misses (the `autotune db` tools)."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import delete
from sqlalchemy.orm import Session

from autotune.db.check import validate_import
from autotune.db.connection import Connection
from autotune.db.export import EXPORT_FORMAT, PREFER
from autotune.db.read import Reads
from autotune.db.schema import (
    KEY_COLUMNS,
    SCHEMA_VERSION,
    Miss,
    Result,
    Trial,
    encode_config,
    utcnow,
)
from autotune.db.write import upsert_entries
from autotune.errors import DatabaseError
from autotune.trial import ENTRY_DEFAULTS


class Admin:
    """The administration of a tuning database (the `autotune db` tools), through its
    `connection`; exports read through `reads`."""

    def __init__(self, connection: Connection, reads: Reads) -> None:
        self.connection, self.reads = connection, reads

    def export(self, **filters: Any) -> dict[str, Any]:
        """Best entries as a portable document (JSON-serialisable; no database ids)."""
        entries = [
            {k: v for k, v in e.as_row().items() if k not in ("id", "trial_id")}
            for e in self.reads.query(**filters)
        ]
        return {"format": EXPORT_FORMAT, "schema": SCHEMA_VERSION, "entries": entries}

    def import_entries(self, doc: Any, prefer: str = "faster") -> dict[str, int]:
        """Add the entries of an exported document; on a key conflict keep the faster entry
        (prefer="faster") or the more recently tuned one (prefer="newer"). Everything is
        validated first (autotune.db.check.validate_import): a bad document changes nothing."""
        if prefer not in PREFER:
            raise DatabaseError(f"unknown preference {prefer!r}: use one of {', '.join(PREFER)}")
        entries = validate_import(doc)
        with self.connection.session(write=True) as s:
            return merge_entries(s, entries, prefer)

    def delete_entries(self, ids: Iterable[int], with_trials: bool = True) -> int:
        """Delete best entries by id (and the trials stored under their keys); returns how many."""
        n = 0
        with self.connection.session(write=True) as s:
            for entry_id in ids:
                row = s.get(Result, entry_id)
                if row is None:
                    continue
                if with_trials:
                    key = {k: getattr(row, k) for k in KEY_COLUMNS}
                    s.execute(delete(Trial).filter_by(**key))
                s.delete(row)
                n += 1
        return n

    def delete_misses(self, ids: Iterable[int]) -> int:
        ids = list(ids)
        with self.connection.session(write=True) as s:
            if ids:
                s.execute(delete(Miss).where(Miss.id.in_(ids)))
        return len(ids)


def _parse_time(text: Any) -> datetime:
    """An entry's tuned_at (checked a date, where given); now where it leaves it out."""
    if text is None:
        return utcnow()
    t = text if isinstance(text, datetime) else datetime.fromisoformat(str(text))
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def _worse(new: dict[str, Any], prefer: str, row: Any) -> bool:
    """Whether the stored `row` is to be kept over the entry `new`."""
    return not _better(new, row, prefer)


def _better(new: dict[str, Any], row: Any, prefer: str) -> bool:
    if prefer == "newer":
        if row.tuned_at is None:  # unreadable (tampered): any real date is newer
            return True
        old = row.tuned_at if row.tuned_at.tzinfo else row.tuned_at.replace(tzinfo=timezone.utc)
        return new["tuned_at"] > old
    return new["time_s"] < row.time_s


def merge_entries(s: Session, entries: list[dict[str, Any]], prefer: str) -> dict[str, int]:
    """Add validated entries in session `s`, in bulk; on a key conflict keep the faster entry
    (prefer="faster") or the more recently tuned one (prefer="newer"). Returns the counts of
    entries added, replaced and kept. An entry's trials live in the other database: it points
    at none here."""
    items = []
    columns = set(Result.__table__.columns.keys()) - {*KEY_COLUMNS, "id"}
    for e in entries:
        key = {k: e[k] for k in KEY_COLUMNS}
        # a field the entry leaves out takes the value a shipped table's entry would
        fields = {k: v for k, v in {**ENTRY_DEFAULTS, **e}.items() if k in columns}
        fields.update(
            config=encode_config(e["config"]),
            tuned_at=_parse_time(e.get("tuned_at")),
            trial_id=None,
        )
        items.append((key, fields, functools.partial(_worse, fields, prefer)))
    counts = {"added": 0, "replaced": 0, "kept": 0}
    for done, _ in upsert_entries(s, items):
        counts[done] += 1
    return counts
