"""Reading a tuning database: best entries (StoredEntry) and trials (StoredTrial, a
TrialRecord under its key), as typed records; misses as plain records.

A row reads as data, never code: its config is JSON decoded (callers validate it against the
current space before use). SQLite stores whatever a tampering hand writes: a number column
holding anything but a number reads as None, so the tools that list and chart rows never
compute with text, and a tool that reads with `skip_tampered` leaves out a row `autotune db
check` would name (`dbcheck.tampered`), with one warning line.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Float, Integer, select

from autotune.dbopen import Connection
from autotune.errors import DatabaseError, SignatureError
from autotune.schema import KEY_COLUMNS, Base, Miss, Result, Trial, decode_config
from autotune.signature import TuningKey, parse_args, short_dtype
from autotune.trial import StoredEntry, StoredTrial, TrialRecord

log = logging.getLogger(__name__)

_TRIAL_FIELDS = frozenset(TrialRecord.__dataclass_fields__) - {"db_id", "run_s"}


def row_record(obj: Base) -> dict[str, Any]:
    """A plain record of a row: its columns, dates as ISO 8601 text, `config` decoded from
    JSON, and a number column that holds no number as None."""
    record = {c.name: getattr(obj, c.name) for c in obj.__table__.columns}
    for c in obj.__table__.columns:
        value = record[c.name]
        if isinstance(value, datetime):
            record[c.name] = value.replace(tzinfo=value.tzinfo or timezone.utc).isoformat()
        elif isinstance(c.type, (Float, Integer)) and not _is_number(value):
            record[c.name] = None
    if "config" in record:
        record["config"] = decode_config(record["config"])
    return record


def stored_trial(record: dict[str, Any]) -> StoredTrial:
    """The typed form of a trials row's record (row_record)."""
    key = TuningKey(**{k: record[k] for k in KEY_COLUMNS})
    fields = {k: v for k, v in record.items() if k in _TRIAL_FIELDS}
    return StoredTrial(
        **fields,
        db_id=record["id"],
        key=key,
        run_id=record["run_id"],
        created_at=record["created_at"],
    )


def _is_number(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


class Reads(Connection):
    """The reads of the TuningDB facade."""

    def best(self, key: TuningKey) -> StoredEntry | None:
        """The best entry of exactly this key, or None."""
        with self.session() as s:
            row = s.scalars(select(Result).filter_by(**key.as_dict())).first()
            return StoredEntry.from_row(row_record(row)) if row else None

    def query(self, **filters: Any) -> list[StoredEntry]:
        """Best entries; filters: any key column, and `dtype` (e.g. float32)."""
        return [StoredEntry.from_row(r) for r in self._select(Result, filters)]

    def trials(self, **filters: Any) -> list[StoredTrial]:
        """Trials, oldest first; filters as in `query`, plus run_id and status."""
        return [stored_trial(r) for r in self._select(Trial, filters)]

    def misses(self, **filters: Any) -> list[dict[str, Any]]:
        """Recorded misses as plain records (key columns, count, first and last seen)."""
        return self._select(Miss, filters)

    def entry(self, entry_id: int) -> StoredEntry | None:
        """One best entry by id (None: no such entry, or one left out as tampered)."""
        with self.session() as s:
            row = s.get(Result, entry_id)
            record = row_record(row) if row else None
        if record is None or not self._readable(Result, [record]):
            return None
        return StoredEntry.from_row(record)

    def _select(self, model: type[Base], filters: dict[str, Any]) -> list[dict[str, Any]]:
        dtype = filters.pop("dtype", None)
        columns = model.__table__.columns
        unknown = sorted(k for k in filters if k not in columns)
        if unknown:
            raise DatabaseError(f"unknown filter(s) {', '.join(unknown)} for {model.__tablename__}")
        stmt = select(model).filter_by(**{k: v for k, v in filters.items() if v is not None})
        with self.session() as s:
            rows = [row_record(r) for r in s.scalars(stmt.order_by(model.id))]
        rows = self._readable(model, rows)
        if dtype is not None:
            want = short_dtype(dtype)
            rows = [r for r in rows if want in _dtypes(r["signature"])]
        return rows

    def _readable(self, model: type[Base], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """`rows` less the tampered ones, when skipping them (each named once per database)."""
        if not self.skip_tampered or model is Miss:
            return rows
        from autotune.dbcheck import tampered

        kept = []
        for r in rows:
            problem = tampered(r, trial=model is Trial)
            if problem is None:
                kept.append(r)
            elif (model.__tablename__, r["id"]) not in self._warned:
                self._warned.add((model.__tablename__, r["id"]))
                log.warning("skipped %s: see `autotune db check`", problem)
        return kept


def _dtypes(signature: str) -> set[str]:
    try:
        return {short_dtype(a.dtype) for a in parse_args(signature)}
    except SignatureError:
        return set()
