"""Alembic revision scripts, one per schema version (see autotune.migrations)."""
