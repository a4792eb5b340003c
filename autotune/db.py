"""The tuning database: the TuningDB facade (models in autotune.schema, URLs and files in
autotune.dbconnect, export documents in autotune.dbexport).

Any SQLAlchemy URL works; the default is a SQLite file in the user's cache directory (WAL mode,
busy timeout), and a PostgreSQL URL serves a team. Configs are stored as JSON text and read back
as data: callers re-validate them against the current space before use.

Schema versions: `schema_info` holds the version a database was written with. Opening one of an
older version runs the Alembic revisions of autotune/migrations in place, in one transaction;
one of a newer version is refused before anything is written. On SQLite every write transaction
starts with BEGIN IMMEDIATE, so concurrent writers queue on the busy timeout instead of failing
on a stale read snapshot.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import sqlite3
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Float,
    Integer,
    create_engine,
    delete,
    event,
    insert,
    inspect,
    select,
    update,
)
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session

from autotune import migrations
from autotune.dbconnect import (
    DEFAULT_BUSY_TIMEOUT_S,
    create_private_file,
    normalize_url,
    server_args,
    sqlite_begin,
    sqlite_file,
    sqlite_pragmas,
    sqlite_reader,
    writable,
)
from autotune.dbexport import EXPORT_FORMAT, PREFER, merge_entries, validate_export
from autotune.errors import DatabaseError, SignatureError
from autotune.schema import (
    KEY_COLUMNS,
    SCHEMA_VERSION,
    Base,
    Miss,
    Result,
    SchemaInfo,
    Trial,
    decode_config,
    encode_config,
    utcnow,
)
from autotune.signature import TuningKey, parse_args, short_dtype
from autotune.trial import BestEntry, TrialRecord

log = logging.getLogger(__name__)


def _row(obj: Base) -> dict[str, Any]:
    """A plain record of a row; `config` decoded from JSON (other callers validate it).

    SQLite stores whatever a tampering hand writes: a number column holding anything but a
    number reads as None, so the tools that list and chart rows never compute with text
    (`autotune db check` names it)."""
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


def _is_number(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


class TuningDB:
    """The tuning database behind any SQLAlchemy URL (default: the per-user SQLite file)."""

    def __init__(
        self,
        url: str | os.PathLike | None = None,
        *,
        busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
        create: bool = True,
        skip_tampered: bool = False,
    ) -> None:
        """`create`: create the database (file and tables) if there is none; tools that only
        read pass False, and are refused one that does not exist. `skip_tampered`: the tools
        pass True: a row that a tampering hand made unreadable (`dbcheck.tampered`) is left out
        of every read, with one warning line naming it (the runtime validates what it serves)."""
        self.url = normalize_url(url)
        self.create = create
        self.skip_tampered = skip_tampered
        self._warned: set[tuple[str, int]] = set()  # the tampered rows named already
        file = sqlite_file(self.url)
        self.read_only = False  # a SQLite file that this process cannot write: served as is
        self._file: Path | None = None  # the SQLite file written to, and its identity
        self._identity: tuple[int, int] | None = None
        self._sidecars: dict[Path, tuple[int, int] | None] = {}  # its -wal and -shm files
        try:
            if file is not None:
                if not file.parent.is_dir():
                    raise DatabaseError(
                        f"database directory {file.parent} does not exist: create it, or pick "
                        "another database (--db, PALLAS_AUTOTUNE_DB)"
                    )
                if not create and not file.is_file():
                    raise DatabaseError(
                        f"tuning database {file} does not exist: check the path (a tool that "
                        "only reads never creates one)"
                    )
                self.read_only = file.exists() and not writable(file)
                if self.read_only:
                    self.engine = sqlite_reader(file, busy_timeout_s)
                else:
                    create_private_file(file)
                    self.engine = create_engine(self.url, connect_args={"timeout": busy_timeout_s})
                event.listen(self.engine, "connect", sqlite_pragmas(busy_timeout_s, self.read_only))
                event.listen(self.engine, "begin", sqlite_begin)
                self._writer = self.engine.execution_options(sqlite_begin="IMMEDIATE")
            else:
                self.engine = create_engine(
                    self.url,
                    pool_pre_ping=True,
                    connect_args=server_args(self.url, busy_timeout_s),
                )
                self._writer = self.engine
            self._prepare()
            if file is not None and not self.read_only:
                self._file, self._identity = file, _identity(file)
        except BaseException as e:
            if hasattr(self, "engine"):
                self.engine.dispose()
            if isinstance(e, (SQLAlchemyError, sqlite3.Error, OSError, ImportError)):
                raise DatabaseError(f"cannot open tuning database {self.url}: {_reason(e)}") from e
            raise

    def _prepare(self) -> None:
        """Create, or migrate, the schema; refuse a newer one before writing anything."""
        with self.engine.connect() as conn:
            version = self._version(conn)
        if version == SCHEMA_VERSION:
            return  # the common case: no write, so a locked database still serves reads
        if version is None and not self.create:
            raise DatabaseError(
                f"{self.url} holds no tuning database (no pallas-autotune tables): check the "
                "URL (a tool that only reads never creates one)"
            )
        with self._writer.begin() as conn:
            if conn.dialect.name == "postgresql":  # serialise concurrent first opens
                conn.exec_driver_sql("SELECT pg_advisory_xact_lock(7007)")
            version = self._version(conn)
            if version is None:
                Base.metadata.create_all(conn)
                conn.execute(insert(SchemaInfo).values(id=1, version=SCHEMA_VERSION))
            elif version < SCHEMA_VERSION:
                migrations.upgrade(conn, version, SCHEMA_VERSION)
                conn.execute(
                    update(SchemaInfo).where(SchemaInfo.id == 1).values(version=SCHEMA_VERSION)
                )

    def _version(self, conn: Connection) -> int | None:
        """The stored schema version (None: no schema yet); raises if it is newer than ours."""
        if not inspect(conn).has_table(SchemaInfo.__tablename__):
            return None
        version = conn.execute(select(SchemaInfo.version).where(SchemaInfo.id == 1)).scalar()
        if version is not None and not isinstance(version, int):
            raise DatabaseError(
                f"tuning database {self.url}: its schema version {str(version)[:40]!r} is not a "
                "number: see `autotune db check`"
            )
        if version is not None and version > SCHEMA_VERSION:
            raise DatabaseError(
                f"tuning database {self.url} has schema v{version}, newer than this "
                f"pallas-autotune (v{SCHEMA_VERSION}): upgrade pallas-autotune to use it"
            )
        return version

    def close(self) -> None:
        self.engine.dispose()

    def check_identity(self) -> None:
        """Refuse to write once the file under the database's path is no longer the one opened
        (deleted, or another database moved there). SQLite would go on writing into the old
        file, and leave its -wal file beside the path, where the next process to open the new
        file would replay it over that database's pages: the -wal and -shm files this process
        wrote are removed (those of another process have another identity and stay)."""
        if self._file is None:
            return
        if _identity(self._file) == self._identity:
            self._sidecars = {p: _identity(p) for p in _sidecar_files(self._file)}
            return
        for path, identity in self._sidecars.items():
            if identity is not None and _identity(path) == identity:
                path.unlink(missing_ok=True)
        raise DatabaseError(
            f"tuning database {self._file} was deleted or replaced while this process used "
            "it: nothing more is written to it; run again"
        )

    def __enter__(self) -> TuningDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ writes

    def add_trials(self, key: TuningKey, run_id: str, trials: Iterable[TrialRecord]) -> list[int]:
        """Store trial records; returns their ids."""
        with self._session(write=True) as s:
            return _add_trials(s, key, run_id, trials)

    def put_best(self, key: TuningKey, entry: BestEntry) -> None:
        """Insert or replace the best entry of a key."""
        self._retry_unique(key, lambda s: _upsert_best(s, key, entry))

    def put_best_among(
        self,
        key: TuningKey,
        entry: BestEntry,
        trial_ids: Iterable[int | None],
        compared: Iterable[int] = (),
    ) -> dict[str, Any] | None:
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
        fields = _best_fields(entry)
        for _ in range(5):  # a concurrent writer may insert the key, or hold SQLite's write lock
            try:
                with self._session(write=True) as s:
                    stmt = select(Result).filter_by(**key.as_dict()).with_for_update()
                    row = s.scalars(stmt).first()
                    if row is None:
                        s.add(Result(**key.as_dict(), **fields))
                    elif row.trial_id in peers and row.config != fields["config"]:
                        return _row(row)
                    else:
                        for k, v in fields.items():
                            setattr(row, k, v)
                    _answer_miss(s, key)
                return None
            except DatabaseError as e:
                if not isinstance(e.__cause__, (IntegrityError, OperationalError)):
                    raise
        raise DatabaseError(f"could not store the best entry of {key.kernel} {key.signature}")

    def record_miss(self, key: TuningKey) -> None:
        """Count a lookup miss of `key` (one atomic write; callers call it once per new key).
        A read-only database has nowhere to count it: nothing is done."""
        if self.read_only:
            return

        def write(s: Session) -> None:
            counted = s.execute(
                update(Miss)
                .filter_by(**key.as_dict())
                .values(count=Miss.count + 1, last_seen=utcnow())
                .execution_options(synchronize_session=False)
            ).rowcount
            if not counted:
                s.add(Miss(**key.as_dict()))

        self._retry_unique(key, write)

    def _retry_unique(self, key: TuningKey, write: Callable[[Session], Any]) -> Any:
        # a concurrent writer may insert the same key between our read and our insert
        for _ in range(3):
            try:
                with self._session(write=True) as s:
                    return write(s)
            except DatabaseError as e:
                if not isinstance(e.__cause__, IntegrityError):
                    raise
        raise DatabaseError(f"could not store {key.kernel} {key.signature}: concurrent writers")

    # ------------------------------------------------------------------ reads

    def best(self, key: TuningKey) -> dict[str, Any] | None:
        with self._session() as s:
            row = s.scalars(select(Result).filter_by(**key.as_dict())).first()
            return _row(row) if row else None

    def query(self, **filters: Any) -> list[dict[str, Any]]:
        """Best entries as plain records; filters: any key column, and `dtype` (e.g. float32)."""
        return self._select(Result, filters)

    def trials(self, **filters: Any) -> list[dict[str, Any]]:
        """Trials as plain records, oldest first; filters as in `query`, plus run_id and status."""
        return self._select(Trial, filters)

    def misses(self, **filters: Any) -> list[dict[str, Any]]:
        return self._select(Miss, filters)

    # ------------------------------------------------------------------ tools

    def entry(self, entry_id: int) -> dict[str, Any] | None:
        """One best entry by id, with `trials`: every trial stored under its key."""
        with self._session() as s:
            row = s.get(Result, entry_id)
            record = _row(row) if row else None
        if record is not None and not self._readable(Result, [record]):
            record = None
        if record is not None:
            record["trials"] = self.trials(**{k: record[k] for k in KEY_COLUMNS})
        return record

    def export(self, **filters: Any) -> dict[str, Any]:
        """Best entries as a portable document (JSON-serialisable; no database ids)."""
        entries = [
            {k: v for k, v in r.items() if k not in ("id", "trial_id")}
            for r in self.query(**filters)
        ]
        return {"format": EXPORT_FORMAT, "schema": SCHEMA_VERSION, "entries": entries}

    def import_entries(self, doc: Any, prefer: str = "faster") -> dict[str, int]:
        """Add the entries of an exported document; on a key conflict keep the faster entry
        (prefer="faster") or the more recently tuned one (prefer="newer"). Everything is
        validated first: a bad document changes nothing."""
        if prefer not in PREFER:
            raise DatabaseError(f"unknown preference {prefer!r}: use one of {', '.join(PREFER)}")
        entries = validate_export(doc)
        with self._session(write=True) as s:
            return merge_entries(s, entries, prefer)

    def delete_entries(self, ids: Iterable[int], with_trials: bool = True) -> int:
        """Delete best entries by id (and the trials stored under their keys); returns how many."""
        n = 0
        with self._session(write=True) as s:
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
        with self._session(write=True) as s:
            if ids:
                s.execute(delete(Miss).where(Miss.id.in_(ids)))
        return len(ids)

    def _select(self, model: type[Base], filters: dict[str, Any]) -> list[dict[str, Any]]:
        dtype = filters.pop("dtype", None)
        columns = model.__table__.columns
        unknown = sorted(k for k in filters if k not in columns)
        if unknown:
            raise DatabaseError(f"unknown filter(s) {', '.join(unknown)} for {model.__tablename__}")
        stmt = select(model).filter_by(**{k: v for k, v in filters.items() if v is not None})
        with self._session() as s:
            rows = [_row(r) for r in s.scalars(stmt.order_by(model.id))]
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

    def _session(self, write: bool = False) -> _GuardedSession:
        if write and self.read_only:
            raise DatabaseError(
                f"tuning database {self.url} is read-only here (its file or folder cannot be "
                "written): write to a copy, or pick another database (--db, PALLAS_AUTOTUNE_DB)"
            )
        return _GuardedSession(self, self._writer if write else self.engine, write)


def _add_trials(
    s: Session, key: TuningKey, run_id: str, trials: Iterable[TrialRecord]
) -> list[int]:
    rows = []
    for t in trials:
        fields = {k: v for k, v in vars(t).items() if k in Trial.__table__.columns}
        fields["config"] = encode_config(t.config)
        rows.append(Trial(**key.as_dict(), run_id=run_id, **fields))
    s.add_all(rows)
    s.flush()
    return [r.id for r in rows]


def _upsert_best(s: Session, key: TuningKey, entry: BestEntry) -> None:
    fields = _best_fields(entry)
    row = s.scalars(select(Result).filter_by(**key.as_dict())).first()
    if row is None:
        s.add(Result(**key.as_dict(), **fields))
    else:
        for k, v in fields.items():
            setattr(row, k, v)
    _answer_miss(s, key)


def _answer_miss(s: Session, key: TuningKey) -> None:
    """A key now tuned is no longer a pending miss, nor are its misses under older versions of
    its kernel: `--pending` tunes those as the current version (autotune.pending)."""
    key_columns = {k: v for k, v in key.as_dict().items() if k != "kernel_version"}
    s.execute(delete(Miss).filter_by(**key_columns))


def _best_fields(entry: BestEntry) -> dict[str, Any]:
    """A results row's columns besides the key: the entry, this host, now."""
    fields = dataclasses.asdict(entry)
    fields.update(config=encode_config(entry.config), host=socket.gethostname(), tuned_at=utcnow())
    return fields


def _dtypes(signature: str) -> set[str]:
    try:
        return {short_dtype(a.dtype) for a in parse_args(signature)}
    except SignatureError:
        return set()


class _GuardedSession:
    """A session in one transaction; any database failure becomes a DatabaseError."""

    def __init__(self, db: TuningDB, bind: Any, write: bool = False) -> None:
        self.db = db
        self.write = write
        self.session = Session(bind, expire_on_commit=False)

    def __enter__(self) -> Session:
        self.session.begin()
        if self.write:
            # a newer pallas-autotune may have upgraded the file since we opened it: never
            # write into a schema we do not know (on SQLite we hold the write lock already)
            try:
                version = self.session.execute(
                    select(SchemaInfo.version).where(SchemaInfo.id == 1)
                ).scalar()
            except BaseException as e:
                self.__exit__(type(e), e, None)
                raise
            try:
                self.db.check_identity()
            except DatabaseError:
                self.session.rollback()
                self.session.close()
                raise
            if version is not None and (not isinstance(version, int) or version > SCHEMA_VERSION):
                self.session.rollback()
                self.session.close()
                raise DatabaseError(
                    f"tuning database {self.db.url} was upgraded to schema v{version} by a newer "
                    f"pallas-autotune (this one writes v{SCHEMA_VERSION}): not written to"
                )
        return self.session

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        try:
            if exc_type is None:
                self.session.commit()
            else:
                self.session.rollback()
        except (SQLAlchemyError, sqlite3.Error) as e:
            self.session.close()
            raise DatabaseError(f"tuning database {self.db.url}: {_reason(e)}") from e
        self.session.close()
        if isinstance(exc, (SQLAlchemyError, sqlite3.Error)):
            raise DatabaseError(f"tuning database {self.db.url}: {_reason(exc)}") from exc
        return False


def _sidecar_files(file: Path) -> tuple[Path, Path]:
    return file.with_name(file.name + "-wal"), file.with_name(file.name + "-shm")


def _identity(file: Path) -> tuple[int, int] | None:
    """The file's device and inode (None: no file there)."""
    try:
        st = os.stat(file)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _reason(e: BaseException) -> str:
    orig = getattr(e, "orig", None)
    return str(orig or e).splitlines()[0]
