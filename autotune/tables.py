"""Tuned entries kept outside the database: a table shipped with a kernel (`tuned=`), and the
entries an overlay serves (autotune.overlays).

Both hold entries of the `autotune db export` format, read as the database's are (StoredEntry),
indexed by their key. The runtime checks an entry it finds here as it checks a database entry
(the key names the kernel version and device kind; the config must lie in the space and keep
the constraints) before serving it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import reprlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from autotune.errors import AutotuneError
from autotune.signature import TuningKey
from autotune.trial import StoredEntry

log = logging.getLogger(__name__)

# the key's fields, which a mapping of an entry must have (KEY_COLUMNS, without SQLAlchemy)
KEY_FIELDS = tuple(TuningKey.__dataclass_fields__)


class EntryTable:
    """Tuned entries by key; `where` says where they came from, in messages."""

    def __init__(self, entries: Iterable[StoredEntry], where: str) -> None:
        self.where = where
        self.entries = list(entries)
        # a later entry of the same key wins, as a later import into a database would
        self._by_key = {e.key: e for e in self.entries}

    def __len__(self) -> int:
        return len(self.entries)

    def best(self, key: TuningKey) -> StoredEntry | None:
        """The entry of exactly this key (kernel version and device kind included), or None."""
        return self._by_key.get(key)

    def stale(self, key: TuningKey) -> StoredEntry | None:
        """An entry of this key but for another version of the kernel, or None."""
        return next(
            (
                e
                for e in self.entries
                if e.key.kernel_version != key.kernel_version
                and e.key == dataclasses.replace(key, kernel_version=e.key.kernel_version)
            ),
            None,
        )

    def query(self, **filters: Any) -> list[StoredEntry]:
        """Entries whose key fields equal every filter given (None: any)."""
        return [
            e
            for e in self.entries
            if all(v is None or getattr(e.key, k) == v for k, v in filters.items())
        ]


def read_entries(path: Path, overlay: bool = False) -> EntryTable:
    """The entries of an exported JSON file, or of every *.json file in a folder (sorted by
    name); an AutotuneError names the file that is missing, unreadable or not an export (a
    shipped table's, or with `overlay` an overlay's)."""
    from autotune.dbexport import validate_export

    if path.is_dir():
        files = sorted(path.glob("*.json"))
    elif path.is_file():
        files = [path]
    elif overlay:
        raise AutotuneError(
            f"overlay {path} does not exist: give an `autotune db export` file or a folder of them"
        )
    else:
        raise AutotuneError(f"tuned table {path} does not exist: ship it as package data")
    entries: list[StoredEntry] = []
    for file in files:
        try:
            doc = json.loads(file.read_text())
            entries += map(StoredEntry.from_row, validate_export(doc))
        except RecursionError:  # json recurses into nested arrays and objects
            raise AutotuneError(
                f"tuned table {file} is not a readable `autotune db export` file (nested too "
                "deeply): export it again"
            ) from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AutotuneError) as e:
            raise AutotuneError(
                f"tuned table {file} is not a readable `autotune db export` file ({e}): "
                "export it again"
            ) from None
    return EntryTable(entries, str(path))


def entries_of(source: Any) -> EntryTable:
    """An EntryTable from what an overlay is given: a path (file or folder of exported JSON),
    an export document, an entry, a tune result (TuneResult: its best entry; a variant
    group's, its members' too), a job's outcome (what `tune_program` returns a list of: its
    result, where it tuned one), or a list or dict of these."""
    if isinstance(source, EntryTable):
        return source
    if isinstance(source, (str, Path)):
        return read_entries(Path(source), overlay=True)
    if isinstance(source, Mapping) and "entries" in source:
        from autotune.dbexport import validate_export

        return EntryTable(map(StoredEntry.from_row, validate_export(source)), "an export document")
    if isinstance(source, StoredEntry):
        return EntryTable([source], "an overlay")
    if isinstance(source, Mapping) and any(k in source for k in (*KEY_FIELDS, "config")):
        missing = [k for k in (*KEY_FIELDS, "config") if k not in source]
        if missing:  # not a dict of entries, but an entry short of fields
            raise AutotuneError(
                f"overlay entry {reprlib.repr(dict(source))} lacks {', '.join(missing)}: give "
                "entries as `autotune db export` writes them, or what autotune.tune returned"
            )
        return EntryTable([StoredEntry.from_row(source)], "an overlay")
    if hasattr(source, "key") and hasattr(source, "best_config"):  # a TuneResult
        entry = StoredEntry(
            key=source.key,
            config=source.best_config,
            time_s=source.best_time_s,
            n_trials=len(source.trials),
            run_id=source.run_id,
            strategy="",
        )
        members = [m for m in getattr(source, "members", {}).values() if m is not None]
        return EntryTable([entry, *entries_of(members).entries], "a tune result")
    if hasattr(source, "status") and hasattr(source, "result"):  # a job's (tune_program's) outcome
        return entries_of([] if source.result is None else [source.result])
    try:
        items = list(source.values() if isinstance(source, Mapping) else source)
    except TypeError:
        raise AutotuneError(
            f"cannot overlay {type(source).__name__}: give a path, an export document, a tune "
            "result or a list of them"
        ) from None
    return EntryTable([e for item in items for e in entries_of(item).entries], "an overlay")


# a `tuned=` path -> its EntryTable (or the AutotuneError reading it failed with), read once
_SHIPPED: dict[Path, EntryTable | AutotuneError] = {}


def shipped_table(tuned: Path) -> EntryTable:
    """The table at `tuned` (a kernel's `tuned=`), read on first use and kept; raises the
    AutotuneError of a table that cannot be read, every time it is asked for."""
    found = _SHIPPED.get(tuned)
    if found is None:
        try:
            found = read_entries(tuned)
        except AutotuneError as e:
            found = e
        _SHIPPED[tuned] = found
    if isinstance(found, AutotuneError):
        raise found
    return found
