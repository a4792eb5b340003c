"""v4: each trial records the workload its kernel's integer data arguments were made by
(`workload`: group sizes, sequence lengths, page tables; autotune.measure.inputs.task_inputs).
Nullable: older trials, and trials of kernels that take no such arguments, read as None."""

import sqlalchemy as sa
from alembic import op

revision = "4"
down_revision = "3"


def upgrade() -> None:
    op.add_column("autotune_trials", sa.Column("workload", sa.String(64), nullable=True))
