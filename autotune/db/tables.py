"""Tuned entries kept outside the database: a table shipped with a kernel (`tuned=`), and the
entries an overlay serves (autotune.runtime.overlays).

Both hold entries of the `autotune db export` format, read as the database's are (StoredEntry),
indexed by their key. The runtime checks an entry it finds here as it checks a database entry
(the key names the kernel version and device kind; the config must lie in the space and keep
the constraints) before serving it.
"""

from __future__ import annotations

import dataclasses
import json
import reprlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from autotune.errors import AutotuneError
from autotune.signature import TuningKey
from autotune.trial import StoredEntry

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


def read_overlay(path: Path) -> EntryTable:
    """The entries of an exported JSON file, or of every *.json file in a folder (sorted by
    name), all read and checked now; an AutotuneError names the file that is missing,
    unreadable or not an export."""
    if path.is_dir():
        files = sorted(path.glob("*.json"))
    elif path.is_file():
        files = [path]
    else:
        raise AutotuneError(
            f"overlay {path} does not exist: give an `autotune db export` file or a folder of them"
        )
    rows = [(file, n, e) for file in files for n, e in _read_file(file, None)]
    return EntryTable(_checked(rows), str(path))


def entries_of(source: Any) -> EntryTable:
    """An EntryTable from what an overlay is given: a path (file or folder of exported JSON),
    an export document, an entry, a tune result (TuneResult: its best entry; a variant
    group's, its members' too), a job's outcome (what `tune_program` returns a list of: its
    result, where it tuned one), or a list or dict of these."""
    if isinstance(source, EntryTable):
        return source
    if isinstance(source, (str, Path)):
        return read_overlay(Path(source))
    if isinstance(source, Mapping) and "entries" in source:
        from autotune.db.export import validate_export

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


class ShippedTable:
    """A table shipped with kernels (`tuned=`: a file, or a folder every shipped kernel may
    share), read as lookups need it: a device kind's entries on its first lookup (a file that
    never names the kind is not parsed; the other kinds' entries are dropped as they are
    parsed), and a kernel's among them checked and keyed on that kernel's first lookup. A
    table of 150,000 entries costs a lookup what its kind's share does (benchmarks/
    shipped_table_cost.py); the tools read it whole (`entries`)."""

    def __init__(self, path: Path) -> None:
        self.where = str(path)
        if path.is_dir():
            self.files = sorted(path.glob("*.json"))
        elif path.is_file():
            self.files = [path]
        else:
            raise AutotuneError(f"tuned table {path} does not exist: ship it as package data")
        # device kind (None: every kind) -> kernel -> its entries as (file, position, raw entry)
        self._rows: dict[str | None, dict[str | None, list[tuple[Path, int, Any]]]] = {}
        self._tables: dict[tuple[str | None, str | None], EntryTable | AutotuneError] = {}

    def for_device(self, kernel: str, device_kind: str) -> EntryTable:
        """The entries of `kernel` on `device_kind`; raises the AutotuneError of a file that
        cannot be read or an entry of theirs that is malformed, every time it is asked for."""
        return self._table(kernel, device_kind)

    def nameless(self, device_kind: str) -> str | None:
        """What is wrong with the entries of `device_kind` that name no kernel (a kernel that is
        not a string): no lookup ever asks for them, so they are said apart; None if none."""
        rows = self._read(device_kind).get(None, ())
        if not rows:
            return None
        file, n, e = rows[0]
        more = f" (and {len(rows) - 1} more)" if len(rows) > 1 else ""
        return (
            f"tuned table {file}: entry {n}{more} names no kernel (kernel "
            f"{reprlib.repr(e.get('kernel'))}): never served; export it again"
        )

    @property
    def entries(self) -> list[StoredEntry]:
        """Every entry, of every kernel and device kind (raises as for_device does)."""
        rows = self._read(None)
        return [e for kernel in rows for e in self._table(kernel, None).entries]

    def _table(self, kernel: str | None, device_kind: str | None) -> EntryTable:
        found = self._tables.get((kernel, device_kind))
        if found is None:
            try:
                found = EntryTable(_checked(self._read(device_kind).get(kernel, ())), self.where)
            except AutotuneError as e:
                found = e
            self._tables[kernel, device_kind] = found
        if isinstance(found, AutotuneError):
            raise found
        return found

    def _read(self, device_kind: str | None) -> dict[str | None, list[tuple[Path, int, Any]]]:
        rows = self._rows.get(device_kind)
        if rows is None:
            if None in self._rows:  # read whole already: that kind's share of it
                rows = {
                    kernel: [r for r in kept if _kind_of(r[2]) in (device_kind, None)]
                    for kernel, kept in self._rows[None].items()
                }
            else:
                rows = {}
                for file in self.files:
                    for n, e in _read_file(file, device_kind):
                        rows.setdefault(_kernel_of(e), []).append((file, n, e))
            self._rows[device_kind] = rows
        return rows


def _read_file(file: Path, device_kind: str | None) -> list[tuple[int, Any]]:
    """The entries of an exported file (those of `device_kind` only, unless None), each with its
    position in the file, unchecked."""
    from autotune.db.export import EXPORT_FORMAT, export_entries

    def other_kind(o: dict[str, Any]) -> bool:
        return "config" in o and "device_kind" in o and o["device_kind"] != device_kind

    try:
        text = file.read_text()
        named = device_kind is None or json.dumps(device_kind) in text
        if not named and json.dumps(EXPORT_FORMAT) in text:
            return []  # an export, without a word about this device kind: nothing to parse
        hook = None if device_kind is None else (lambda o: None if other_kind(o) else o)
        entries = export_entries(json.loads(text, object_hook=hook))
    except RecursionError:  # json recurses into nested arrays and objects
        raise AutotuneError(_unreadable(file, "nested too deeply")) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AutotuneError) as e:
        raise AutotuneError(_unreadable(file, e)) from None
    return [(n, e) for n, e in enumerate(entries, 1) if e is not None]


def _checked(rows: Iterable[tuple[Path, int, Any]]) -> list[StoredEntry]:
    from autotune.db.export import validate_entry

    entries = []
    for file, n, e in rows:
        try:
            validate_entry(e, n)
        except AutotuneError as err:
            raise AutotuneError(_unreadable(file, err)) from None
        entries.append(StoredEntry.from_row(e))
    return entries


def _unreadable(file: Path, why: Any) -> str:
    return (
        f"tuned table {file} is not a readable `autotune db export` file ({why}): export it again"
    )


def _kernel_of(e: Any) -> str | None:
    kernel = e.get("kernel") if isinstance(e, dict) else None
    return kernel if isinstance(kernel, str) else None


def _kind_of(e: Any) -> Any:
    return e.get("device_kind") if isinstance(e, dict) else None


# a `tuned=` path -> its ShippedTable (or the AutotuneError opening it failed with)
_SHIPPED: dict[Path, ShippedTable | AutotuneError] = {}


def shipped_table(tuned: Path) -> ShippedTable:
    """The table at `tuned` (a kernel's `tuned=`), kept once asked for; raises the
    AutotuneError of a table that does not exist, every time it is asked for."""
    found = _SHIPPED.get(tuned)
    if found is None:
        try:
            found = ShippedTable(tuned)
        except AutotuneError as e:
            found = e
        _SHIPPED[tuned] = found
    if isinstance(found, AutotuneError):
        raise found
    return found
