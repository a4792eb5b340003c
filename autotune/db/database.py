"""TuningDB: the tuning database behind any SQLAlchemy URL, one class over its rooms (see the
package's docstring): a Connection, and the Reads, Writes and Admin that work through it."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from sqlalchemy.engine import Engine

from autotune.db.admin import Admin
from autotune.db.connection import Connection
from autotune.db.read import Reads
from autotune.db.write import Writes
from autotune.signature import TuningKey
from autotune.sql import DEFAULT_BUSY_TIMEOUT_S
from autotune.trial import BestEntry, StoredEntry, StoredTrial, TrialRecord


class TuningDB:
    """The tuning database behind any SQLAlchemy URL (default: the per-user SQLite file,
    $PALLAS_AUTOTUNE_DB where set). `create`: create the database if there is none (tools that
    only read pass False). `skip_tampered`: leave out of every read a row that `autotune db
    check` would name (the tools pass True). It serves best entries by key (`best`), as the
    shipped tables and overlays do (autotune.trial.EntrySource)."""

    def __init__(
        self,
        url: str | os.PathLike | None = None,
        *,
        busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
        create: bool = True,
        skip_tampered: bool = False,
    ) -> None:
        self.connection = Connection(url, busy_timeout_s=busy_timeout_s, create=create)
        self.reads = Reads(self.connection, skip_tampered)
        self.writes = Writes(self.connection)
        self.admin = Admin(self.connection, self.reads)

    @property
    def url(self) -> str:
        return self.connection.url

    @property
    def engine(self) -> Engine:
        return self.connection.engine

    @property
    def read_only(self) -> bool:
        return self.connection.read_only

    def close(self) -> None:
        self.connection.close()

    def __enter__(self) -> TuningDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # reads (autotune.db.read)
    def best(self, key: TuningKey) -> StoredEntry | None:
        return self.reads.best(key)

    def query(self, **filters: Any) -> list[StoredEntry]:
        return self.reads.query(**filters)

    def entries_state(self, **filters: Any) -> tuple:
        return self.reads.entries_state(**filters)

    def entry_shapes(self, **filters: Any) -> tuple[tuple, list[tuple[str, str, str]]]:
        return self.reads.entry_shapes(**filters)

    def trials(self, **filters: Any) -> list[StoredTrial]:
        return self.reads.trials(**filters)

    def misses(self, **filters: Any) -> list[dict[str, Any]]:
        return self.reads.misses(**filters)

    def entry(self, entry_id: int) -> StoredEntry | None:
        return self.reads.entry(entry_id)

    # writes (autotune.db.write)
    def add_trials(self, key: TuningKey, run_id: str, trials: Iterable[TrialRecord]) -> list[int]:
        return self.writes.add_trials(key, run_id, trials)

    def put_best(self, key: TuningKey, entry: BestEntry) -> None:
        self.writes.put_best(key, entry)

    def put_best_among(
        self,
        key: TuningKey,
        entry: BestEntry,
        trial_ids: Iterable[int | None],
        compared: Iterable[int] = (),
    ) -> StoredEntry | None:
        return self.writes.put_best_among(key, entry, trial_ids, compared)

    def record_miss(self, key: TuningKey) -> None:
        self.writes.record_miss(key)

    # administration (autotune.db.admin)
    def export(self, **filters: Any) -> dict[str, Any]:
        return self.admin.export(**filters)

    def import_entries(self, doc: Any, prefer: str = "faster") -> dict[str, int]:
        return self.admin.import_entries(doc, prefer)

    def delete_entries(self, ids: Iterable[int], with_trials: bool = True) -> int:
        return self.admin.delete_entries(ids, with_trials)

    def delete_misses(self, ids: Iterable[int]) -> int:
        return self.admin.delete_misses(ids)
