"""Claims on tuning keys: a watcher (autotune.service.watch) tunes a key only while it holds the key's
claim, so two watchers never tune one key at once, on one host or across a fleet.

A claim is a lock that ends with its holder, however the holder ends (a SIGKILL included), so
no claim outlives a dead watcher and none needs a heartbeat: on PostgreSQL an advisory lock
held by a connection of its own; on SQLite (watchers on one host) a lock on one byte of a file
beside the database (`tuning.db` -> `tuning.db-claims`), the byte the key's number names.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Iterator
from typing import Any

from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from autotune.errors import DatabaseError
from autotune.signature import TuningKey
from autotune.sql import sqlite_file


def key_number(key: TuningKey) -> int:
    """A key's number, a signed 64-bit integer (what PostgreSQL's advisory locks take)."""
    digest = hashlib.sha256("\x1f".join(key.as_dict().values()).encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


@contextlib.contextmanager
def claim(db: Any, key: TuningKey) -> Iterator[bool]:
    """Whether this process holds `key`'s claim in the tuning database `db` (a TuningDB) for the
    duration of the context: False if another holds it (nothing waits)."""
    number = key_number(key)
    if db.url.startswith("postgresql"):
        with _advisory_lock(db, number) as held:
            yield held
        return
    file = sqlite_file(db.url)
    if file is None:  # a database in memory: no other process can see it
        yield True
        return
    with _byte_lock(file.with_name(file.name + "-claims"), number) as held:
        yield held


@contextlib.contextmanager
def _advisory_lock(db: Any, number: int) -> Iterator[bool]:
    # its own connection, outside any transaction: the lock lives as long as the session, and
    # an idle session in no transaction is never ended by the server's transaction time limits
    try:
        conn = db.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        held = conn.execute(text("SELECT pg_try_advisory_lock(:n)"), {"n": number}).scalar()
    except SQLAlchemyError as e:
        reason = str(getattr(e, "orig", None) or e).splitlines()[0]
        raise DatabaseError(f"cannot claim a key in {db.url}: {reason}") from e
    try:
        yield bool(held)
    finally:
        with contextlib.suppress(SQLAlchemyError):  # a lost connection released it already
            if held:
                conn.execute(text("SELECT pg_advisory_unlock(:n)"), {"n": number})
        conn.close()


@contextlib.contextmanager
def _byte_lock(file: Any, number: int) -> Iterator[bool]:
    # a POSIX record lock: the kernel drops it when the process ends; the file stays empty
    try:
        fd = os.open(file, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        raise DatabaseError(
            f"cannot claim a key in {file}: {e.strerror or e}: give --db a database whose "
            "folder can be written"
        ) from e
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, number & (2**62 - 1))
        except OSError:  # held by another process
            yield False
            return
        yield True
    finally:
        os.close(fd)  # releases the lock
