"""The tuning database: SQLAlchemy models and the TuningDB facade.

Any SQLAlchemy URL works; the default is a SQLite file in the user's cache directory (WAL mode,
busy timeout), and a PostgreSQL URL serves a team. Configs are stored as JSON text and read back
as data: callers re-validate them against the current space before use.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import time
from collections.abc import Iterable
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
    UniqueConstraint,
    create_engine,
    delete,
    event,
    select,
)
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError, SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from autotune.errors import DatabaseError, SignatureError
from autotune.settings import default_db_path
from autotune.signature import TuningKey, parse_args, short_dtype

SCHEMA_VERSION = 1
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

    __tablename__ = "trials"
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
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Result(_KeyColumns, Base):
    """The best configuration of one key, with its provenance."""

    __tablename__ = "results"
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
    tuned_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Miss(_KeyColumns, Base):
    """A key that model code asked for and the database did not have."""

    __tablename__ = "misses"
    __table_args__ = (UniqueConstraint(*KEY_COLUMNS, name="uq_misses_key"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    count: Mapped[int] = mapped_column(Integer, default=1)
    first_seen: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_seen: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


def normalize_url(url: str | os.PathLike | None) -> str:
    """An SQLAlchemy URL from a URL, a file path, or None ($PALLAS_AUTOTUNE_DB, else the
    default per-user file)."""
    url = url if url is not None else os.environ.get("PALLAS_AUTOTUNE_DB") or None
    if url is None:
        path = default_db_path()
        _make_private_dir(path.parent)
        return f"sqlite:///{path}"
    url = os.fspath(url)
    if url.startswith(("postgresql://", "postgres://")):
        # the driver of the `postgres` extra; SQLAlchemy 2.0 would pick psycopg2 for a bare URL
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    if "://" in url:
        return url
    return f"sqlite:///{Path(url).expanduser().resolve()}"


def _make_private_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)


def _sqlite_file(url: str) -> Path | None:
    prefix = "sqlite:///"
    if url.startswith(prefix) and url[len(prefix) :] not in ("", ":memory:"):
        return Path(url[len(prefix) :])
    return None


def _row(obj: Base) -> dict[str, Any]:
    """A plain record of a row; `config` decoded from JSON (other callers validate it)."""
    record = {c.name: getattr(obj, c.name) for c in obj.__table__.columns}
    for name, value in record.items():
        if isinstance(value, datetime):
            record[name] = value.replace(tzinfo=value.tzinfo or timezone.utc).isoformat()
    if "config" in record:
        record["config"] = decode_config(record["config"])
    return record


def decode_config(text: Any) -> Any:
    """JSON text to a value; anything undecodable comes back as None (never executed)."""
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return None


def encode_config(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


class TuningDB:
    """The tuning database behind any SQLAlchemy URL (default: the per-user SQLite file)."""

    def __init__(self, url: str | os.PathLike | None = None) -> None:
        self.url = normalize_url(url)
        file = _sqlite_file(self.url)
        try:
            if file is not None:
                if not file.parent.is_dir():
                    raise DatabaseError(
                        f"database directory {file.parent} does not exist: create it or pick another --db"
                    )
                new = not file.exists()
                self.engine = create_engine(self.url, connect_args={"timeout": 30})
                event.listen(self.engine, "connect", _sqlite_pragmas)
            else:
                new = False
                self.engine = create_engine(self.url, pool_pre_ping=True)
            self._prepare_once_created()
            if file is not None and new:
                os.chmod(file, 0o600)
        except DatabaseError:
            raise
        except (SQLAlchemyError, sqlite3.Error, OSError) as e:
            raise DatabaseError(f"cannot open tuning database {self.url}: {_reason(e)}") from e

    def _prepare_once_created(self) -> None:
        """`_prepare`, retried: workers of a fleet that open a new PostgreSQL database together
        race to create its tables and types, and the losers see them already there."""
        for attempt in range(5):
            try:
                return self._prepare()
            except (IntegrityError, ProgrammingError):
                if attempt == 4:
                    raise
                time.sleep(0.2 * (attempt + 1))

    def _prepare(self) -> None:
        Base.metadata.create_all(self.engine)
        with Session(self.engine) as s, s.begin():
            info = s.get(SchemaInfo, 1)
            if info is None:
                try:
                    with s.begin_nested():
                        s.add(SchemaInfo(id=1, version=SCHEMA_VERSION))
                except IntegrityError:  # another process created it first
                    pass
            elif info.version > SCHEMA_VERSION:
                raise DatabaseError(
                    f"tuning database {self.url} has schema v{info.version}, newer than this "
                    f"pallas-autotune (v{SCHEMA_VERSION}): upgrade pallas-autotune to use it"
                )

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> TuningDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ writes

    def add_trials(
        self, key: TuningKey, run_id: str, trials: Iterable[dict[str, Any]]
    ) -> list[int]:
        """Store trial records (fields of Trial; `config` a dict); returns their ids."""
        with self._session() as s:
            rows = []
            for t in trials:
                fields = {k: v for k, v in t.items() if k in Trial.__table__.columns}
                fields["config"] = encode_config(t["config"])
                rows.append(Trial(**key.as_dict(), run_id=run_id, **fields))
            s.add_all(rows)
            s.flush()
            return [r.id for r in rows]

    def put_best(self, key: TuningKey, entry: dict[str, Any]) -> None:
        """Insert or replace the best entry of a key."""
        fields = _best_fields(entry)
        for _ in range(3):  # a concurrent writer may insert the same key between our read and write
            try:
                with self._session() as s:
                    row = s.scalars(select(Result).filter_by(**key.as_dict())).first()
                    if row is None:
                        s.add(Result(**key.as_dict(), **fields))
                    else:
                        for k, v in fields.items():
                            setattr(row, k, v)
                return
            except DatabaseError as e:
                if not isinstance(e.__cause__, IntegrityError):
                    raise
        raise DatabaseError(f"could not store the best entry of {key.kernel} {key.signature}")

    def put_best_among(
        self, key: TuningKey, entry: dict[str, Any], trial_ids: Iterable[int | None]
    ) -> bool:
        """Store `entry` as the best of `key`, unless the stored entry is one of `trial_ids`
        (another worker of the same study) and at least as fast; True if it was stored.

        Compared and written in one transaction (the row locked where the database can), so
        workers of one study that finish in any order keep the fastest trial of them all.
        """
        ids = {i for i in trial_ids if i is not None}
        fields = _best_fields(entry)
        for _ in range(5):  # a concurrent writer may insert the key, or hold SQLite's write lock
            try:
                with self._session() as s:
                    stmt = select(Result).filter_by(**key.as_dict()).with_for_update()
                    row = s.scalars(stmt).first()
                    if row is None:
                        s.add(Result(**key.as_dict(), **fields))
                    elif row.trial_id in ids and row.time_s <= fields["time_s"]:
                        return False
                    else:
                        for k, v in fields.items():
                            setattr(row, k, v)
                return True
            except DatabaseError as e:
                if not isinstance(e.__cause__, (IntegrityError, OperationalError)):
                    raise
        raise DatabaseError(f"could not store the best entry of {key.kernel} {key.signature}")

    def record_miss(self, key: TuningKey) -> None:
        """Count a lookup miss of `key` (one write; callers call it once per new key)."""
        for _ in range(3):
            try:
                with self._session() as s:
                    row = s.scalars(select(Miss).filter_by(**key.as_dict())).first()
                    if row is None:
                        s.add(Miss(**key.as_dict()))
                    else:
                        row.count += 1
                        row.last_seen = utcnow()
                return
            except DatabaseError as e:
                if not isinstance(e.__cause__, IntegrityError):
                    raise

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
        with self._session() as s:
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
        with self._session() as s:
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
        with self._session() as s:
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

    def _session(self) -> _GuardedSession:
        return _GuardedSession(self)


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
        if e["platform"] not in ("cpu", "tpu", "gpu"):
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

    def __init__(self, db: TuningDB) -> None:
        self.db = db
        self.session = Session(db.engine, expire_on_commit=False)

    def __enter__(self) -> Session:
        self.session.begin()
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


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA journal_mode=WAL")
    cur.close()
