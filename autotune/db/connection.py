"""Opening a tuning database and knowing it is still the one opened: the connection every
room of TuningDB (autotune.db.database) works through.

Any SQLAlchemy URL works; the default is a SQLite file in the user's cache directory (WAL mode,
busy timeout), and a PostgreSQL URL serves a team. Opening checks the schema version: one of an
older version is upgraded in place by the Alembic revisions of autotune/migrations, in one
transaction; one of a newer version is refused before anything is written. On SQLite every
write transaction starts with BEGIN IMMEDIATE, so concurrent writers queue on the busy timeout
instead of failing on a stale read snapshot, and every write first checks that the file under
the path is still the one opened (`check_identity`).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event, insert, inspect, select, update
from sqlalchemy.engine import Connection as SqlConnection
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from autotune.db import migrations
from autotune.db.schema import SCHEMA_VERSION, Base, SchemaInfo
from autotune.errors import DatabaseError
from autotune.sql import (
    DEFAULT_BUSY_TIMEOUT_S,
    GuardedConnection,
    close_interrupted_cursors,
    create_private_file,
    default_db_path,
    make_private_dir,
    normalize_url,
    not_tuned_yet,
    server_args,
    sqlite_begin,
    sqlite_file,
    sqlite_pragmas,
    sqlite_reader,
    writable,
)


class Connection:
    """An open tuning database: its engines, and sessions that turn every database failure
    into a DatabaseError (`session`)."""

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
        file = sqlite_file(self.url)
        self.read_only = False  # a SQLite file that this process cannot write: served as is
        self._file: Path | None = None  # the SQLite file written to, and its identity
        self._identity: tuple[int, int] | None = None
        self._sidecars: dict[Path, tuple[int, int] | None] = {}  # its -wal and -shm files
        try:
            if file is not None:
                default = file == default_db_path()
                if not create and not file.is_file():
                    raise DatabaseError(
                        not_tuned_yet(file)
                        if default
                        else f"tuning database {file} does not exist: check the path (a tool "
                        "that only reads never creates one)"
                    )
                if default:  # the per-user folder: made private by the first open
                    make_private_dir(file.parent)
                if not file.parent.is_dir():
                    raise DatabaseError(
                        f"database directory {file.parent} does not exist: create it, or pick "
                        "another database (--db, PALLAS_AUTOTUNE_DB)"
                    )
                self.read_only = file.exists() and not writable(file)
                if self.read_only:
                    self.engine = sqlite_reader(file, busy_timeout_s)
                else:
                    create_private_file(file)
                    self.engine = create_engine(
                        self.url,
                        connect_args={"timeout": busy_timeout_s, "factory": GuardedConnection},
                    )
                event.listen(self.engine, "connect", sqlite_pragmas(busy_timeout_s, self.read_only))
                event.listen(self.engine, "begin", sqlite_begin)
                close_interrupted_cursors(self.engine)
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
            # ValueError: text SQLite holds that is not UTF-8 (a garbled file)
            if isinstance(e, (SQLAlchemyError, sqlite3.Error, OSError, ImportError, ValueError)):
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

    def _version(self, conn: SqlConnection) -> int | None:
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

    def session(self, write: bool = False) -> _GuardedSession:
        if write and self.read_only:
            raise DatabaseError(
                f"tuning database {self.url} is read-only here (its file, its folder or its "
                "-shm file cannot be written): write to a copy, or pick another database (--db, "
                "PALLAS_AUTOTUNE_DB)"
            )
        return _GuardedSession(self, self._writer if write else self.engine, write)


class _GuardedSession:
    """A session in one transaction; any database failure becomes a DatabaseError."""

    def __init__(self, db: Connection, bind: Any, write: bool = False) -> None:
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
