"""The tuning database: the TuningDB facade over any SQLAlchemy URL (default: the per-user
SQLite file), in rooms of one job each:

- autotune.dbopen: opening (schema version, upgrade, a newer one refused), the identity of a
  SQLite file, sessions whose failures are DatabaseErrors;
- autotune.dbwrite: trials, best entries (one upsert for every writer), misses;
- autotune.dbread: typed reads (StoredEntry, StoredTrial), tampered rows left out by the tools;
- autotune.dbadmin: export, import (the merge rule: autotune.dbexport), delete.

The tables are autotune.schema's; URLs and files autotune.dbconnect's.
"""

from __future__ import annotations

from autotune.dbadmin import Admin


class TuningDB(Admin):
    """The tuning database behind any SQLAlchemy URL (default: the per-user SQLite file):
    `TuningDB(url, create=..., skip_tampered=...)` opens it (see autotune.dbopen.Connection),
    and it reads, writes and administers its entries, trials and misses."""
