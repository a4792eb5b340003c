"""TuningDB: the tuning database behind any SQLAlchemy URL, its rooms composed (see the
package's docstring)."""

from __future__ import annotations

from autotune.db.admin import Admin


class TuningDB(Admin):
    """The tuning database behind any SQLAlchemy URL (default: the per-user SQLite file):
    `TuningDB(url, create=..., skip_tampered=...)` opens it (see autotune.db.connection.Connection),
    and it reads, writes and administers its entries, trials and misses."""
