"""v2: the tables are prefixed (`autotune_trials`, ...), so that Optuna's tables (one is
`trials`) can share a database, and each trial records the oracle that judged it (`oracle`).
`schema_info` keeps its name: a pallas-autotune of any version finds the version there."""

import sqlalchemy as sa
from alembic import op

revision = "2"
down_revision = "1"

# table -> its indexed columns (ix_<table>_<column>, named after the table as SQLAlchemy does)
INDEXED = {"trials": ("kernel", "run_id"), "results": ("kernel",), "misses": ("kernel",)}


def upgrade() -> None:
    for table, columns in INDEXED.items():
        prefixed = f"autotune_{table}"
        op.rename_table(table, prefixed)
        for column in columns:
            op.drop_index(f"ix_{table}_{column}", table_name=prefixed, if_exists=True)
            op.create_index(f"ix_{prefixed}_{column}", prefixed, [column])
    op.add_column("autotune_trials", sa.Column("oracle", sa.String(32), nullable=True))
