"""Writing to a tuning database: trials, best entries (one upsert, `upsert_entry`, for every
writer: a run's winner, a shared study's, an imported entry), and counted misses."""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session

from autotune.db.connection import Connection
from autotune.db.read import row_record
from autotune.db.schema import KEY_COLUMNS, Miss, Result, Trial, encode_config, utcnow
from autotune.errors import DatabaseError
from autotune.signature import TuningKey
from autotune.trial import BestEntry, StoredEntry, TrialRecord

KEYS_PER_QUERY = 500  # signatures looked up per SELECT of a bulk upsert (few bound parameters)

# A key's columns, its row's other columns, and whether to keep the row stored, given it
# (None: always replace it)
Upsert = tuple[Mapping[str, Any], Mapping[str, Any], "Callable[[Any], bool] | None"]


def upsert_entry(
    s: Session,
    key: Mapping[str, Any],
    fields: Mapping[str, Any],
    keep: Callable[[Any], bool] | None = None,
) -> tuple[str, Any]:
    """Store the best entry of `key` (its columns: `fields`) in session `s`: added where the
    key has none, else the stored row replaced, unless `keep(row)` says to keep it (`row`: the
    stored columns, as attributes). Returns what was done ("added", "replaced" or "kept") and
    the stored row's columns (None where added). The row is locked where the database can, so
    a concurrent writer waits for this transaction."""
    return upsert_entries(s, [(key, fields, keep)])[0]


def upsert_entries(s: Session, items: Sequence[Upsert]) -> list[tuple[str, Any]]:
    """upsert_entry for many keys in one statement per batch, in order (a key given twice
    meets what its first item left): the stored rows read, and locked, KEYS_PER_QUERY keys a
    query; the new rows inserted and the replaced ones updated in bulk."""
    stored: dict[tuple, Any] = {}
    # by the key's other columns, then signatures IN a batch: the unique index's own order
    signatures: dict[tuple, dict[str, None]] = {}
    for key, _, _ in items:
        signatures.setdefault(_rest_of(key), {})[key["signature"]] = None
    table = Result.__table__
    for rest, wanted in signatures.items():
        same = [table.c[k] == v for k, v in zip(_REST, rest)]
        wanted = list(wanted)
        for start in range(0, len(wanted), KEYS_PER_QUERY):
            batch = wanted[start : start + KEYS_PER_QUERY]
            stmt = select(table).where(*same, table.c.signature.in_(batch)).with_for_update()
            stored.update((_key_of(row._mapping), row) for row in s.execute(stmt))
    added: dict[tuple, dict[str, Any]] = {}  # new rows by key, as they will be inserted
    replaced: dict[int, dict[str, Any]] = {}  # stored rows' new columns by id
    pending: dict[tuple, dict[str, Any]] = {}  # the columns of the rows written so far
    done = []
    for key, fields, keep in items:
        k = _key_of(key)
        row = SimpleNamespace(**pending[k]) if k in pending else stored.get(k)
        if row is None:
            added[k] = pending[k] = {**key, **fields}
            done.append(("added", None))
        elif keep is not None and keep(row):
            done.append(("kept", row))
        else:
            if k in added:  # a key given twice: the row still to be inserted takes the fields
                added[k].update(fields)
            else:
                replaced.setdefault(row.id, {"id": row.id}).update(fields)
            pending[k] = {**_columns(row), **fields}
            done.append(("replaced", row))
    # executemany wants one set of columns per statement: rows grouped by theirs
    for group in _by_columns(added.values()):
        s.execute(insert(Result), group)
    for group in _by_columns(replaced.values()):
        s.execute(update(Result), group)
    return done


_REST = tuple(k for k in KEY_COLUMNS if k != "signature")


def _rest_of(columns: Mapping[str, Any]) -> tuple:
    return tuple(columns[k] for k in _REST)


def _key_of(columns: Mapping[str, Any]) -> tuple:
    return tuple(columns[k] for k in KEY_COLUMNS)


def _columns(row: Any) -> dict[str, Any]:
    return dict(row._mapping) if hasattr(row, "_mapping") else dict(vars(row))


def _by_columns(rows: Iterable[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    groups: dict[frozenset, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(frozenset(row), []).append(row)
    return list(groups.values())


class Writes:
    """The writes to a tuning database, through its `connection`."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    def add_trials(self, key: TuningKey, run_id: str, trials: Iterable[TrialRecord]) -> list[int]:
        """Store trial records; returns their ids."""
        with self.connection.session(write=True) as s:
            rows = []
            for t in trials:
                fields = {k: v for k, v in vars(t).items() if k in Trial.__table__.columns}
                fields["config"] = encode_config(t.config)
                rows.append(Trial(**key.as_dict(), run_id=run_id, **fields))
            s.add_all(rows)
            s.flush()
            return [r.id for r in rows]

    def put_best(self, key: TuningKey, entry: BestEntry) -> None:
        """Insert or replace the best entry of a key."""
        # a concurrent writer may insert the same key between our read and our insert
        self._put_best(key, entry, None, (IntegrityError,), 3)

    def put_best_among(
        self,
        key: TuningKey,
        entry: BestEntry,
        trial_ids: Iterable[int | None],
        compared: Iterable[int] = (),
    ) -> StoredEntry | None:
        """Store `entry` as the best of `key`, unless another worker of the same study stored a
        different configuration that this worker has not re-measured beside its own winner:
        that entry is returned, nothing is stored, and the caller re-measures it side by side
        and tries again with it among `compared`. `trial_ids` are the study's trials (every
        worker's), `compared` the trials of the stored entries this worker has judged.

        Read and written in one transaction (the row locked where the database can), so of two
        workers that finish together, the later one always learns of the other's entry: the
        winner is never decided by two machines' separate, and perhaps lucky, samples.
        """
        peers = {i for i in trial_ids if i is not None} - set(compared)
        config = encode_config(entry.config)

        def keep(row: Any) -> bool:
            return row.trial_id in peers and row.config != config

        # a concurrent writer may insert the key, or hold SQLite's write lock
        return self._put_best(key, entry, keep, (IntegrityError, OperationalError), 5)

    def _put_best(
        self,
        key: TuningKey,
        entry: BestEntry,
        keep: Callable[[Any], bool] | None,
        retry_on: tuple[type[Exception], ...],
        tries: int,
    ) -> StoredEntry | None:
        """upsert_entry in a transaction of its own, tried again on `retry_on`; the stored
        entry kept (`keep`), or None where `entry` was stored (and its key's misses answered)."""
        fields = _best_fields(entry)
        for _ in range(tries):
            try:
                with self.connection.session(write=True) as s:
                    done, row = upsert_entry(s, key.as_dict(), fields, keep)
                    if done == "kept":
                        return StoredEntry.from_row(row_record(Result.__table__, row))
                    _answer_miss(s, key)
                return None
            except DatabaseError as e:
                if not isinstance(e.__cause__, retry_on):
                    raise
        raise DatabaseError(f"could not store the best entry of {key.kernel} {key.signature}")

    def record_miss(self, key: TuningKey) -> None:
        """Count a lookup miss of `key` (one atomic write; callers call it once per new key).
        A read-only database has nowhere to count it: nothing is done."""
        if self.connection.read_only:
            return
        for _ in range(3):  # a concurrent writer may insert the key between our update and insert
            try:
                with self.connection.session(write=True) as s:
                    counted = s.execute(
                        update(Miss)
                        .filter_by(**key.as_dict())
                        .values(count=Miss.count + 1, last_seen=utcnow())
                        .execution_options(synchronize_session=False)
                    ).rowcount
                    if not counted:
                        s.add(Miss(**key.as_dict()))
                return
            except DatabaseError as e:
                if not isinstance(e.__cause__, IntegrityError):
                    raise
        raise DatabaseError(f"could not store {key.kernel} {key.signature}: concurrent writers")


def _answer_miss(s: Session, key: TuningKey) -> None:
    """A key now tuned is no longer a pending miss, nor are its misses under older versions of
    its kernel: `--pending` tunes those as the current version (autotune.service.pending)."""
    key_columns = {k: v for k, v in key.as_dict().items() if k != "kernel_version"}
    s.execute(delete(Miss).filter_by(**key_columns))


def _best_fields(entry: BestEntry) -> dict[str, Any]:
    """A results row's columns besides the key: the entry, this host, now."""
    fields = {f.name: getattr(entry, f.name) for f in dataclasses.fields(BestEntry)}
    fields.update(config=encode_config(entry.config), host=socket.gethostname(), tuned_at=utcnow())
    return fields
