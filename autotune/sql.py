"""Where a tuning database lives and how it is opened: URLs and files, private SQLite files with
their pragmas (WAL, busy timeout, BEGIN IMMEDIATE for writers), read-only SQLite engines, and a
server's time limits."""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import sqlite3
import threading
import time
import urllib.parse
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError

from autotune.errors import DatabaseError

DEFAULT_BUSY_TIMEOUT_S = 30.0  # tools wait this long for another writer; the runtime much less


def default_db_path() -> Path:
    """The per-user SQLite file: $XDG_CACHE_HOME/pallas-autotune/tuning.db."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "pallas-autotune" / "tuning.db"


def not_tuned_yet(file: Path) -> str:
    """What the absence of the per-user database means, and the command that ends it."""
    return (
        f"nothing is tuned yet: there is no tuning database at {file} (the per-user default); "
        "`autotune tune KERNEL --shape ...` tunes a kernel and creates it"
    )


def normalize_url(url: str | os.PathLike | None) -> str:
    """An SQLAlchemy URL from a URL, a file path, or None ($PALLAS_AUTOTUNE_DB, else the
    default per-user file)."""
    url = url if url is not None else os.environ.get("PALLAS_AUTOTUNE_DB") or None
    if url is None:  # its folder is made by the first open that creates the database
        return sqlite_url(default_db_path())
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
    """Refuse a database URL whose kind is unknown or whose driver is not installed, or a
    SQLite file that is a folder or in a folder that does not exist, without connecting or
    creating anything."""
    if not str(url).strip():
        raise DatabaseError(f"{what} is empty: give a file path or a database URL")
    file = sqlite_file(normalize_url(url))
    if file is not None and file.is_dir():
        raise DatabaseError(
            f"{what} {url} is a folder: give a file in it (e.g. {file / 'tuning.db'}) or a "
            "database URL"
        )
    if file is not None and not file.parent.is_dir():
        raise DatabaseError(
            f"{what} {url}: its folder {file.parent} does not exist: create it, or give "
            "another path"
        )
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


def make_private_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)


def sqlite_file(url: str) -> Path | None:
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
        return sqlite3.connect(
            uri,
            uri=True,
            timeout=busy_timeout_s,
            check_same_thread=False,
            factory=GuardedConnection,
        )

    return create_engine(sqlite_url(file), creator=connect)


def writable(file: Path) -> bool:
    """Whether SQLite can write `file`: the file itself (if it exists), its -shm file (if it
    exists: SQLite maps it writable only where it can be written) and, for the -wal and -shm
    files beside it, its folder."""
    shm = file.with_name(file.name + "-shm")
    return (
        os.access(file.parent, os.W_OK)
        and (not file.exists() or os.access(file, os.W_OK))
        and (not shm.exists() or os.access(shm, os.W_OK))
    )


class GuardedConnection(sqlite3.Connection):
    """A SQLite connection that never writes through a -shm file that can no longer be written
    (every SQLite connection of this package is one: `sqlite3.connect(..., factory=...)`).

    SQLite keeps a WAL database's index in the -shm file beside it, mapped into memory, and
    writes it through that mapping, reads included (they mark what they read), and closing the
    last connection checkpoints through it. Once the file can no longer be written (its file
    system turned read-only, or it was made immutable), such a write is a SIGBUS, which kills
    the process: model code would die of its database. So where this process mapped the file
    writable, each statement, commit and rollback first checks that it still can be written;
    where it cannot, the connection refuses (an OperationalError, which callers say in one
    line), and it and the other connections to the file are never closed: they are kept, unused,
    until the process ends. A process that opens the database once the file cannot be written
    maps it read-only (SQLite's own fallback: `writable` then serves the database read-only) and
    reads it as usual.
    """

    def __init__(self, database: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(database, *args, **kwargs)
        self._kept = False
        self._shm = _shared_memory(str(database), bool(kwargs.get("uri")))
        if self._shm is not None:
            self._shm.opened(self)

    def _refuse_if_lost(self) -> None:
        if self._left_alone():
            raise sqlite3.OperationalError(
                f"its -shm file {self._shm.path} can no longer be written (a read-only file "
                "system?): this process leaves the database alone"
            )

    def cursor(self, *args: Any, **kwargs: Any) -> sqlite3.Cursor:
        self._refuse_if_lost()
        return super().cursor(*args, **kwargs)

    def execute(self, *args: Any, **kwargs: Any) -> sqlite3.Cursor:
        self._refuse_if_lost()
        return super().execute(*args, **kwargs)

    def executemany(self, *args: Any, **kwargs: Any) -> sqlite3.Cursor:
        self._refuse_if_lost()
        return super().executemany(*args, **kwargs)

    def executescript(self, *args: Any, **kwargs: Any) -> sqlite3.Cursor:
        self._refuse_if_lost()
        return super().executescript(*args, **kwargs)

    def commit(self) -> None:
        self._refuse_if_lost()
        super().commit()

    def rollback(self) -> None:
        if not self._left_alone():
            super().rollback()

    def close(self) -> None:
        if not self._left_alone():
            super().close()
            if self._shm is not None:
                self._shm.closed(self)

    def __del__(self) -> None:
        # closed as it is collected (at the latest as the interpreter ends): kept instead
        with contextlib.suppress(Exception):
            self._left_alone()

    def _left_alone(self) -> bool:
        """Whether this connection is kept, never to be used or closed (see the class)."""
        if self._kept or (self._shm is not None and self._shm.lost()):
            self._shm.keep_all()
            return True
        return False


class _SharedMemory:
    """What this process knows of one database's -shm file: whether its connections mapped it
    writable (SQLite maps it so where it can be written when the first of them reads), and
    which of them are open."""

    # held by the class, not the module: the interpreter's clean-up clears module globals
    # before it frees the connections that still ask these
    _access = staticmethod(os.access)
    _W_OK = os.W_OK
    _exists = staticmethod(os.path.exists)
    _incref = ctypes.pythonapi.Py_IncRef
    _incref.argtypes = [ctypes.py_object]
    _incref.restype = None

    def __init__(self, path: str) -> None:
        self.path = path
        self.mapped_writable = False
        self.connections: weakref.WeakSet[GuardedConnection] = weakref.WeakSet()
        self.lock = threading.Lock()  # the searches of several devices open connections too

    def opened(self, conn: GuardedConnection) -> None:
        with self.lock:
            if not self.connections:  # none holds the mapping: the next one maps it afresh
                self.mapped_writable = _can_write(self.path)
            self.connections.add(conn)

    def closed(self, conn: GuardedConnection) -> None:
        with self.lock:
            self.connections.discard(conn)

    def lost(self) -> bool:
        """Whether the file this process mapped writable can no longer be written (one
        access(2) call in the common case)."""
        writable = self._access(self.path, self._W_OK)
        return self.mapped_writable and not writable and self._exists(self.path)

    def keep_all(self) -> None:
        """Keep every open connection to the file, never to be closed: an extra reference,
        never dropped, keeps each from being freed (which closes it)."""
        with self.lock:
            kept = list(self.connections)
        for conn in kept:
            if not conn._kept:
                conn._kept = True
                self._incref(conn)


def _shared_memory(database: str, uri: bool) -> _SharedMemory | None:
    """The -shm file of a connection's database (None: in memory, or opened immutable, which
    maps none)."""
    if uri:
        parsed = urllib.parse.urlparse(database)
        if "immutable=1" in parsed.query:
            return None
        database = urllib.parse.unquote(parsed.path)
    if database in ("", ":memory:"):
        return None
    path = os.path.abspath(database) + "-shm"
    return _SHM_FILES.setdefault(path, _SharedMemory(path))


def _can_write(shm: str) -> bool:
    if os.path.exists(shm):
        return os.access(shm, os.W_OK)
    return os.access(os.path.dirname(shm), os.W_OK)  # SQLite creates it, writable


_SHM_FILES: dict[str, _SharedMemory] = {}


def create_private_file(file: Path) -> None:
    """Create a new database file 0600 before SQLite opens it (its -wal and -shm files copy
    the mode); an empty file is a valid empty SQLite database."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(file, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))


def sqlite_pragmas(busy_timeout_s: float, read_only: bool) -> Callable[[Any, Any], None]:
    def on_connect(dbapi_conn: Any, _record: Any) -> None:
        # transactions are begun by sqlite_begin, not by the driver (SQLAlchemy's recipe)
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")  # an int we computed
        if not read_only:  # switching the journal mode is a write
            _switch_to_wal(cur, busy_timeout_s)
        cur.close()

    return on_connect


def _switch_to_wal(cur: sqlite3.Cursor, busy_timeout_s: float) -> None:
    """PRAGMA journal_mode=WAL, retried while the file is locked, up to the busy timeout.

    The switch reads the file under a shared lock, then asks for an exclusive one. When another
    connection is switching at the same moment, SQLite answers "database is locked" at once
    instead of calling the busy handler (waiting could deadlock: each holds what the other
    waits for). Eight processes opening a new file together hit that in about 1 round in 9;
    the caller's busy timeout is what they agreed to wait."""
    deadline = time.monotonic() + busy_timeout_s
    pause = 0.005
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            busy = e.sqlite_errorcode & 0xFF == sqlite3.SQLITE_BUSY  # or an extended BUSY code
            if not busy or time.monotonic() >= deadline:
                raise
        time.sleep(pause)
        pause = min(2 * pause, 0.1)


def sqlite_begin(conn: Connection) -> None:
    mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
    conn.exec_driver_sql("BEGIN IMMEDIATE" if mode == "IMMEDIATE" else "BEGIN")


def close_interrupted_cursors(engine: Engine) -> None:
    """Close the cursor of a statement that an interrupt (Ctrl-C, or SIGTERM's exit) lands in,
    on a SQLite engine. SQLAlchemy discards that connection without closing the cursor, and
    SQLite keeps a connection closed with a statement unfinished as a zombie that holds its
    transaction's locks (BEGIN IMMEDIATE's write lock) for as long as the cursor lives: the
    interrupt's traceback holds it. Every other connection to the file then waits out its busy
    timeout and fails, the interrupted run's own clean-up included (and a notebook's, until its
    last traceback is dropped)."""
    event.listen(engine, "handle_error", _close_interrupted_cursor)


def _close_interrupted_cursor(ctx: Any) -> None:
    if isinstance(ctx.original_exception, Exception):  # an error, not an interrupt
        return
    cursor = getattr(ctx.execution_context, "cursor", None)
    if cursor is not None:
        with contextlib.suppress(Exception):  # what a handler raises would replace the interrupt
            cursor.close()


def server_args(url: str, busy_timeout_s: float) -> dict[str, Any]:
    """PostgreSQL: wait at most the busy timeout for a lock, and for the server to answer."""
    if not url.startswith("postgresql+psycopg"):
        return {}
    ms = int(busy_timeout_s * 1000)
    return {
        "connect_timeout": max(2, math.ceil(busy_timeout_s)),
        "options": f"-c lock_timeout={ms}",
    }
