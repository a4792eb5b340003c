"""Administering a tuning database: exporting its entries, importing (merging) an export, and
deleting entries and misses (the `autotune db` tools)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import delete

from autotune.dbexport import EXPORT_FORMAT, PREFER, merge_entries, validate_export
from autotune.dbread import Reads
from autotune.dbwrite import Writes
from autotune.errors import DatabaseError
from autotune.schema import KEY_COLUMNS, SCHEMA_VERSION, Miss, Result, Trial


class Admin(Reads, Writes):
    """The administration of the TuningDB facade."""

    def export(self, **filters: Any) -> dict[str, Any]:
        """Best entries as a portable document (JSON-serialisable; no database ids)."""
        entries = [
            {k: v for k, v in e.as_row().items() if k not in ("id", "trial_id")}
            for e in self.query(**filters)
        ]
        return {"format": EXPORT_FORMAT, "schema": SCHEMA_VERSION, "entries": entries}

    def import_entries(self, doc: Any, prefer: str = "faster") -> dict[str, int]:
        """Add the entries of an exported document; on a key conflict keep the faster entry
        (prefer="faster") or the more recently tuned one (prefer="newer"). Everything is
        validated first: a bad document changes nothing."""
        if prefer not in PREFER:
            raise DatabaseError(f"unknown preference {prefer!r}: use one of {', '.join(PREFER)}")
        entries = validate_export(doc)
        with self.session(write=True) as s:
            return merge_entries(s, entries, prefer)

    def delete_entries(self, ids: Iterable[int], with_trials: bool = True) -> int:
        """Delete best entries by id (and the trials stored under their keys); returns how many."""
        n = 0
        with self.session(write=True) as s:
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
        with self.session(write=True) as s:
            if ids:
                s.execute(delete(Miss).where(Miss.id.in_(ids)))
        return len(ids)
