"""The tuning database, behind any SQLAlchemy URL (default: the per-user SQLite file):

- database.py: TuningDB, the one class model code, the tuner and the tools use;
- connection.py: opening (schema version, upgrade, a newer one refused), the identity of a
  SQLite file, sessions whose failures are DatabaseErrors;
- write.py: trials, best entries (one upsert for every writer), misses;
- read.py: typed reads (StoredEntry, StoredTrial), tampered rows left out by the tools;
- admin.py: export, import (the merge rule), delete; export.py: the export document;
- check.py: `autotune db check`; schema.py and migrations/: the tables and their upgrades;
- tables.py: entries outside the database (shipped tables, overlays), in the export format;
- landscape.py: an exhaustive run exported for replay (autotune.search.landscapes).

URLs and files are autotune.sql's. Importing this package loads no SQLAlchemy: `TuningDB` loads
it on first use, so the runtime can read shipped tables without it.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "TuningDB":
        from autotune.db.database import TuningDB

        return TuningDB
    raise AttributeError(f"module 'autotune.db' has no attribute {name!r}")
