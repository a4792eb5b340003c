"""The tuning database: SQLAlchemy models and the TuningDB facade.

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

import contextlib
import json
import math
import os
import socket
import sqlite3
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Boolean,
    DateTime,
    Float,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    create_engine,
    delete,
    event,
    insert,
    inspect,
    select,
    update,
)
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from autotune import migrations
from autotune.errors import DatabaseError, SignatureError
from autotune.platforms import PLATFORMS
from autotune.settings import default_db_path
from autotune.signature import TuningKey, parse_args, short_dtype
from autotune.trial import TrialRecord

# The newest revision of autotune/migrations/versions (a test holds the two equal), known here
# without Alembic so that opening a current database stays cheap. v1: the first released
# schema (tests/fixtures/v1.db); v2: the tables are prefixed (`autotune_trials`, ...), and each
# trial records the oracle that judged it (`oracle`).
SCHEMA_VERSION = 2
DEFAULT_BUSY_TIMEOUT_S = 30.0  # tools wait this long for another writer; the runtime much less
KEY_COLUMNS = (
    "kernel",
    "kernel_version",
    "platform",
    "device_kind",
    "backend",
    "signature",
    "static",
)
TRIAL_STATUSES = (
    "ok",
    "rejected",
    "compile_error",
    "runtime_error",
    "pruned",
    "crashed",
    "timeout",
)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def table_names(version: int) -> dict[str, str]:
    """The tables of schema `version`, by what they hold: results, trials, misses."""
    prefix = "autotune_" if version >= 2 else ""
    return {role: prefix + role for role in ("results", "trials", "misses")}


TABLES = table_names(SCHEMA_VERSION)


class ReadableDateTime(TypeDecorator):
    """A timestamp column that reads a value SQLite holds but cannot parse (a tampering hand
    wrote it) as None, so that one bad row never fails a whole query (`db check` names it)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def result_processor(self, dialect: Any, coltype: Any) -> Callable[[Any], Any] | None:
        inner = self.impl_instance.result_processor(dialect, coltype)
        if inner is None:
            return None

        def process(value: Any) -> Any:
            try:
                return inner(value)
            except (ValueError, TypeError):
                return None

        return process


class Base(DeclarativeBase):
    pass


class _KeyColumns:
    kernel: Mapped[str] = mapped_column(String(200), index=True)
    kernel_version: Mapped[str] = mapped_column(String(64))
    platform: Mapped[str] = mapped_column(String(16))
    device_kind: Mapped[str] = mapped_column(String(200))
    backend: Mapped[str] = mapped_column(String(32))
    signature: Mapped[str] = mapped_column(String(1000))
    static: Mapped[str] = mapped_column(String(1000), default="{}")


class SchemaInfo(Base):
    __tablename__ = "schema_info"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(Integer)


class Trial(_KeyColumns, Base):
    """One measured (or failed) candidate of a tuning run."""

    __tablename__ = TABLES["trials"]
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str] = mapped_column(String(64), index=True)
    config: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(32))
    is_default: Mapped[bool] = mapped_column(Boolean, default=False)
    time_s: Mapped[float | None] = mapped_column(Float, nullable=True)  # median
    time_min_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    time_p10_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    time_p90_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    n_reps: Mapped[int | None] = mapped_column(Integer, nullable=True)
    timer: Mapped[str | None] = mapped_column(String(32), nullable=True)
    compile_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    max_error: Mapped[float | None] = mapped_column(Float, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    # which oracle judged it: "interpret" or "reference" (autotune.oracle); v2
    oracle: Mapped[str | None] = mapped_column(String(32), nullable=True)
    created_at: Mapped[datetime] = mapped_column(ReadableDateTime, default=utcnow)


class Result(_KeyColumns, Base):
    """The best configuration of one key, with its provenance."""

    __tablename__ = TABLES["results"]
    __table_args__ = (UniqueConstraint(*KEY_COLUMNS, name="uq_results_key"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    config: Mapped[str] = mapped_column(Text)
    time_s: Mapped[float] = mapped_column(Float)
    default_time_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    speedup: Mapped[float | None] = mapped_column(Float, nullable=True)
    n_trials: Mapped[int] = mapped_column(Integer)
    n_rejected: Mapped[int] = mapped_column(Integer)
    trial_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    run_id: Mapped[str] = mapped_column(String(64))
    strategy: Mapped[str] = mapped_column(String(32))
    timer: Mapped[str] = mapped_column(String(32))
    jax_version: Mapped[str] = mapped_column(String(32))
    jaxlib_version: Mapped[str] = mapped_column(String(32))
    runtime_version: Mapped[str] = mapped_column(String(200), default="")
    host: Mapped[str] = mapped_column(String(200), default="")
    tuned_at: Mapped[datetime] = mapped_column(ReadableDateTime, default=utcnow)


class Miss(_KeyColumns, Base):
    """A key that model code asked for and the database did not have."""

    __tablename__ = TABLES["misses"]
    __table_args__ = (UniqueConstraint(*KEY_COLUMNS, name="uq_misses_key"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    count: Mapped[int] = mapped_column(Integer, default=1)
    first_seen: Mapped[datetime] = mapped_column(ReadableDateTime, default=utcnow)
    last_seen: Mapped[datetime] = mapped_column(ReadableDateTime, default=utcnow)


def normalize_url(url: str | os.PathLike | None) -> str:
    """An SQLAlchemy URL from a URL, a file path, or None ($PALLAS_AUTOTUNE_DB, else the
    default per-user file)."""
    url = url if url is not None else os.environ.get("PALLAS_AUTOTUNE_DB") or None
    if url is None:
        path = default_db_path()
        _make_private_dir(path.parent)
        return sqlite_url(path)
    url = os.fspath(url)
    if url.startswith(("postgresql://", "postgres://")):
        # the driver of the `postgres` extra; SQLAlchemy 2.0 would pick psycopg2 for a bare URL
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    if "://" in url:
        return url
    return sqlite_url(Path(url).expanduser().resolve())


def sqlite_url(path: Path) -> str:
    """The SQLAlchemy URL of exactly this SQLite file: SQLAlchemy reads `%` in a URL as an
    escape, `?` as the start of a query and `#` as a fragment, so those are escaped."""
    text = str(path).replace("%", "%25").replace("?", "%3F").replace("#", "%23")
    return f"sqlite:///{text}"


def check_url(url: str, what: str = "--db") -> None:
    """Refuse a database URL whose kind is unknown or whose driver is not installed, without
    connecting or creating anything."""
    if not str(url).strip():
        raise DatabaseError(f"{what} is empty: give a file path or a database URL")
    try:
        create_engine(normalize_url(url)).dispose()  # loads the driver; connects to nothing
    except ImportError as e:
        raise DatabaseError(
            f"{what} {url}: its database driver is not installed ({e}): install it, or use a "
            "file path or a postgresql:// URL (pip install 'pallas-autotune[postgres]')"
        ) from None
    except ArgumentError as e:
        raise DatabaseError(
            f"{what} {url} is not a database URL ({e}): give a file path, sqlite:///FILE or "
            "postgresql://USER@HOST/NAME"
        ) from None


def _make_private_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)


def _sqlite_file(url: str) -> Path | None:
    """The file of a SQLite URL (None: not SQLite, or in memory)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return None
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def sqlite_reader(file: Path, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S) -> Engine:
    """An engine that only reads `file`. WAL mode reads through the -shm file; in a folder
    that cannot be written (a read-only mount, a database baked into an image) SQLite cannot
    create it, so a database without one is opened immutable: nothing can be writing to it."""
    shm = file.with_name(file.name + "-shm")
    mode = "mode=ro" if shm.exists() or os.access(file.parent, os.W_OK) else "immutable=1"
    uri = f"{file.absolute().as_uri()}?{mode}"  # as_uri escapes what a URI would misread

    def connect() -> sqlite3.Connection:
        return sqlite3.connect(uri, uri=True, timeout=busy_timeout_s, check_same_thread=False)

    return create_engine(sqlite_url(file), creator=connect)


def _writable(file: Path) -> bool:
    """Whether SQLite can write `file`: the file itself (if it exists) and, for the -wal and
    -shm files beside it, its folder."""
    return os.access(file.parent, os.W_OK) and (not file.exists() or os.access(file, os.W_OK))


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


def decode_config(text: Any) -> Any:
    """JSON text to a value; anything undecodable comes back as None (never executed)."""
    try:
        return json.loads(text)
    except (TypeError, ValueError, RecursionError):  # RecursionError: nested too deep
        return None


def encode_config(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


class TuningDB:
    """The tuning database behind any SQLAlchemy URL (default: the per-user SQLite file)."""

    def __init__(
        self,
        url: str | os.PathLike | None = None,
        *,
        busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
        create: bool = True,
    ) -> None:
        """`create`: create the database (file and tables) if there is none; tools that only
        read pass False, and are refused one that does not exist."""
        self.url = normalize_url(url)
        self.create = create
        file = _sqlite_file(self.url)
        self.read_only = False  # a SQLite file that this process cannot write: served as is
        self._file: Path | None = None  # the SQLite file written to, and its identity
        self._identity: tuple[int, int] | None = None
        self._sidecars: dict[Path, tuple[int, int] | None] = {}  # its -wal and -shm files
        try:
            if file is not None:
                if not file.parent.is_dir():
                    raise DatabaseError(
                        f"database directory {file.parent} does not exist: create it, or pick another database (--db, PALLAS_AUTOTUNE_DB)"
                    )
                if not create and not file.is_file():
                    raise DatabaseError(
                        f"tuning database {file} does not exist: check the path (a tool that "
                        "only reads never creates one)"
                    )
                self.read_only = file.exists() and not _writable(file)
                if self.read_only:
                    self.engine = sqlite_reader(file, busy_timeout_s)
                else:
                    _create_private_file(file)
                    self.engine = create_engine(self.url, connect_args={"timeout": busy_timeout_s})
                event.listen(
                    self.engine, "connect", _sqlite_pragmas(busy_timeout_s, self.read_only)
                )
                event.listen(self.engine, "begin", _sqlite_begin)
                self._writer = self.engine.execution_options(sqlite_begin="IMMEDIATE")
            else:
                self.engine = create_engine(
                    self.url,
                    pool_pre_ping=True,
                    connect_args=_server_args(self.url, busy_timeout_s),
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

    def put_best(self, key: TuningKey, entry: dict[str, Any]) -> None:
        """Insert or replace the best entry of a key."""
        self._retry_unique(key, lambda s: _upsert_best(s, key, entry))

    def put_best_among(
        self,
        key: TuningKey,
        entry: dict[str, Any],
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
        counts = {"added": 0, "replaced": 0, "kept": 0}
        with self._session(write=True) as s:
            for e in entries:
                key = {k: e[k] for k in KEY_COLUMNS}
                fields = {k: v for k, v in e.items() if k in Result.__table__.columns}
                fields["config"] = encode_config(e["config"])
                fields["tuned_at"] = _parse_time(e.get("tuned_at"))
                row = s.scalars(select(Result).filter_by(**key)).first()
                if row is None:
                    s.add(Result(**{**fields, **key}))
                    counts["added"] += 1
                elif _better(fields, row, prefer):
                    for k, v in fields.items():
                        setattr(row, k, v)
                    row.trial_id = None  # its trials live in the other database
                    counts["replaced"] += 1
                else:
                    counts["kept"] += 1
        return counts

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
        if dtype is not None:
            want = short_dtype(dtype)
            rows = [r for r in rows if want in _dtypes(r["signature"])]
        return rows

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


def _upsert_best(s: Session, key: TuningKey, entry: dict[str, Any]) -> None:
    fields = _best_fields(entry)
    row = s.scalars(select(Result).filter_by(**key.as_dict())).first()
    if row is None:
        s.add(Result(**key.as_dict(), **fields))
    else:
        for k, v in fields.items():
            setattr(row, k, v)
    _answer_miss(s, key)


def _answer_miss(s: Session, key: TuningKey) -> None:
    """A key now tuned is no longer a pending miss."""
    s.execute(delete(Miss).filter_by(**key.as_dict()))


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


def _better(new: dict[str, Any], row: Result, prefer: str) -> bool:
    if prefer == "newer":
        if row.tuned_at is None:  # unreadable (tampered): any real date is newer
            return True
        old = row.tuned_at if row.tuned_at.tzinfo else row.tuned_at.replace(tzinfo=timezone.utc)
        return new["tuned_at"] > old
    return new["time_s"] < row.time_s


def _best_fields(entry: dict[str, Any]) -> dict[str, Any]:
    fields = {
        k: v for k, v in entry.items() if k in Result.__table__.columns and k not in KEY_COLUMNS
    }
    fields["config"] = encode_config(entry["config"])
    fields.setdefault("host", socket.gethostname())
    fields["tuned_at"] = utcnow()
    fields.pop("id", None)
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


def _reason(e: BaseException) -> str:
    orig = getattr(e, "orig", None)
    return str(orig or e).splitlines()[0]


def _sidecar_files(file: Path) -> tuple[Path, Path]:
    return file.with_name(file.name + "-wal"), file.with_name(file.name + "-shm")


def _identity(file: Path) -> tuple[int, int] | None:
    """The file's device and inode (None: no file there)."""
    try:
        st = os.stat(file)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _create_private_file(file: Path) -> None:
    """Create a new database file 0600 before SQLite opens it (its -wal and -shm files copy
    the mode); an empty file is a valid empty SQLite database."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(file, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))


def _sqlite_pragmas(busy_timeout_s: float, read_only: bool) -> Callable[[Any, Any], None]:
    def on_connect(dbapi_conn: Any, _record: Any) -> None:
        # transactions are begun by _sqlite_begin, not by the driver (SQLAlchemy's recipe)
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")  # an int we computed
        if not read_only:  # switching the journal mode is a write
            cur.execute("PRAGMA journal_mode=WAL")
        cur.close()

    return on_connect


def _sqlite_begin(conn: Connection) -> None:
    mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
    conn.exec_driver_sql("BEGIN IMMEDIATE" if mode == "IMMEDIATE" else "BEGIN")


def _server_args(url: str, busy_timeout_s: float) -> dict[str, Any]:
    """PostgreSQL: wait at most the busy timeout for a lock, and for the server to answer."""
    if not url.startswith("postgresql+psycopg"):
        return {}
    ms = int(busy_timeout_s * 1000)
    return {
        "connect_timeout": max(2, math.ceil(busy_timeout_s)),
        "options": f"-c lock_timeout={ms}",
    }
