"""The tuning database's schema migrations: Alembic revision scripts in `versions/`.

Each schema version N is the revision "N" (`versions/vN_*.py`), whose `down_revision` is N - 1
and whose `upgrade()` turns a database of schema N - 1 into one of schema N with `alembic.op`.
Revision "1" is the first released schema, the base every upgrade starts from; a new database
is created from the models at the newest schema, so no revision ever runs on it.

The version stays in the project's `schema_info` table rather than in an Alembic version
table: every pallas-autotune release reads it there to refuse a newer file, and Optuna's own
`alembic_version` table may share a PostgreSQL database with ours. So revisions are run here
one by one, on the caller's connection and inside its transaction, never through Alembic's
environment (no env.py, no alembic.ini): a failure leaves the old schema untouched.

To change the schema:
1. change the models in autotune/db/schema.py (and `table_names` if a table is renamed: the read-only
   `db check` reads an older schema by its own names);
2. add `versions/vN_<what>.py` with `revision = "N"`, `down_revision = "N-1"` and `upgrade()`,
   naming tables and columns as they are at that revision, not through the models (which move
   on); there is no downgrade(), since a newer schema is refused, never rewritten;
3. set `SCHEMA_VERSION = N` in autotune/db/schema.py.
tests/test_schema.py then checks that the newest revision is SCHEMA_VERSION and that the v1
fixture, upgraded, has exactly the models' schema (Alembic's autogenerate comparison, which
names what a missing upgrade step should do), on SQLite and on PostgreSQL.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.engine import Connection

SCRIPTS = Path(__file__).parent  # holds versions/, as an Alembic script directory does


def upgrade(conn: Connection, version: int, to: int) -> None:
    """Run the revisions after `version` up to `to`, oldest first, on `conn` (whose transaction
    the caller owns). Alembic is imported here only: opening a current database never needs it."""
    from alembic.operations import Operations
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    revisions = ScriptDirectory(str(SCRIPTS)).iterate_revisions(str(to), str(version))
    context = MigrationContext.configure(conn)
    with Operations.context(context):
        for revision in reversed(list(revisions)):
            revision.module.upgrade()
