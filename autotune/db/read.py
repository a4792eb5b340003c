"""Reading a tuning database: best entries (StoredEntry) and trials (StoredTrial, a
TrialRecord under its key), as typed records; misses as plain records.

A row reads as data, never code: its config is JSON decoded (callers validate it against the
current space before use). SQLite stores whatever a tampering hand writes: a number column
holding anything but a number reads as None, so the tools that list and chart rows never
compute with text, and a tool that reads with `skip_tampered` leaves out a row `autotune db
check` would name (`dbcheck.tampered`), with one warning line.
"""

from __future__ import annotations

import functools
import logging
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Float, Integer, Table, func, select

from autotune.db.connection import Connection
from autotune.db.schema import (
    KEY_COLUMNS,
    Base,
    Miss,
    ReadableDateTime,
    Result,
    Trial,
    decode_config,
)
from autotune.errors import DatabaseError, SignatureError
from autotune.signature import TuningKey, parse_args, short_dtype
from autotune.trial import StoredEntry, StoredTrial, TrialRecord

log = logging.getLogger(__name__)

_TRIAL_FIELDS = frozenset(TrialRecord.__dataclass_fields__) - {"db_id", "run_s"}


def row_record(table: Table, row: Any) -> dict[str, Any]:
    """A plain record of a `table` row (a Core row, as a select of the table returns): its
    columns, dates as ISO 8601 text, `config` decoded from JSON, and a number column that
    holds no number as None."""
    record = dict(row._mapping)
    dates, numbers = _column_kinds(table)
    for name in dates:
        value = record[name]
        if isinstance(value, datetime):
            record[name] = value.replace(tzinfo=value.tzinfo or timezone.utc).isoformat()
    for name in numbers:
        if not _is_number(record[name]):
            record[name] = None
    if "config" in record:
        record["config"] = decode_config(record["config"])
    return record


@functools.cache
def _column_kinds(table: Table) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A table's date columns and number columns, by name."""
    dates = tuple(c.name for c in table.columns if isinstance(c.type, ReadableDateTime))
    numbers = tuple(c.name for c in table.columns if isinstance(c.type, (Float, Integer)))
    return dates, numbers


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


class Reads:
    """The reads of a tuning database, through its `connection`. With `skip_tampered` (the
    tools), a row that a tampering hand made unreadable (`autotune.db.check.tampered`) is left
    out of every read, with one warning line naming it (the runtime validates what it serves)."""

    def __init__(self, connection: Connection, skip_tampered: bool = False) -> None:
        self.connection = connection
        self.skip_tampered = skip_tampered
        self._warned: set[tuple[str, int]] = set()  # the tampered rows named already

    def best(self, key: TuningKey) -> StoredEntry | None:
        """The best entry of exactly this key, or None."""
        table = Result.__table__
        with self.connection.session() as s:
            row = s.execute(select(table).filter_by(**key.as_dict())).first()
            return StoredEntry.from_row(row_record(table, row)) if row else None

    def query(self, **filters: Any) -> list[StoredEntry]:
        """Best entries; filters: any key column, and `dtype` (e.g. float32)."""
        return [StoredEntry.from_row(r) for r in self._select(Result, filters)]

    def entries_state(self, **filters: Any) -> tuple:
        """What changes whenever a best entry under `filters` (key columns) is added, replaced
        or deleted: their count, last id, latest tuning time and total time (every writer
        here tunes anew, or merges in a faster or newer entry). One indexed query."""
        with self.connection.session() as s:
            return self._state(s, filters)

    def entry_shapes(self, **filters: Any) -> tuple[tuple, list[tuple[str, str, str]]]:
        """The entries_state and the (signature, kernel version, config as JSON text) of the
        best entries under `filters` (key columns), read together: autotune.runtime.nearest's index.
        Text columns, fetched as the driver gives them: 100k rows in well under 0.1 s."""
        table = Result.__table__
        columns = (table.c.signature, table.c.kernel_version, table.c.config)
        with self.connection.session() as s:
            # the state first: a write between the two reads (each its own snapshot on a
            # server) then shows as a change at the next check, never hides one
            state = self._state(s, filters)
            result = s.connection().execute(select(*columns).filter_by(**filters))
            return state, result.cursor.fetchall()

    @staticmethod
    def _state(s: Any, filters: dict[str, Any]) -> tuple:
        table = Result.__table__
        aggregates = (
            func.count(),
            func.max(table.c.id),
            func.max(table.c.tuned_at),
            func.sum(table.c.time_s),
        )
        return tuple(s.execute(select(*aggregates).filter_by(**filters)).one())

    def trials(self, **filters: Any) -> list[StoredTrial]:
        """Trials, oldest first; filters as in `query`, plus run_id and status."""
        return [stored_trial(r) for r in self._select(Trial, filters)]

    def misses(self, **filters: Any) -> list[dict[str, Any]]:
        """Recorded misses as plain records (key columns, count, first and last seen)."""
        return self._select(Miss, filters)

    def entry(self, entry_id: int) -> StoredEntry | None:
        """One best entry by id (None: no such entry, or one left out as tampered)."""
        table = Result.__table__
        with self.connection.session() as s:
            row = s.execute(select(table).where(table.c.id == entry_id)).first()
            record = row_record(table, row) if row else None
        if record is None or not self._readable(Result, [record]):
            return None
        return StoredEntry.from_row(record)

    def _select(self, model: type[Base], filters: dict[str, Any]) -> list[dict[str, Any]]:
        dtype = filters.pop("dtype", None)
        columns = model.__table__.columns
        unknown = sorted(k for k in filters if k not in columns)
        if unknown:
            raise DatabaseError(f"unknown filter(s) {', '.join(unknown)} for {model.__tablename__}")
        table = model.__table__
        stmt = select(table).filter_by(**{k: v for k, v in filters.items() if v is not None})
        with self.connection.session() as s:
            rows = [row_record(table, r) for r in s.execute(stmt.order_by(table.c.id))]
        rows = self._readable(model, rows)
        if dtype is not None:
            want = short_dtype(dtype)
            rows = [r for r in rows if want in _dtypes(r["signature"])]
        return rows

    def _readable(self, model: type[Base], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """`rows` less the tampered ones, when skipping them (each named once per database)."""
        if not self.skip_tampered or model is Miss:
            return rows
        from autotune.db.check import tampered

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
