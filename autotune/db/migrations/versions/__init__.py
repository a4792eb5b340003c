"""Alembic revision scripts, one per schema version (see autotune.db.migrations)."""
