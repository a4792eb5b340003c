"""v3: each trial records the device that measured it (`device`), the fingerprint of the
program it compiled to and, for a duplicate, the trial that was measured in its place
(`fingerprint`, `duplicate_of`), and the compiler's memory analysis of that program
(`memory_argument_bytes`, `memory_output_bytes`, `memory_temp_bytes`, `memory_peak_bytes`).
Every new column is nullable: older trials read as unknown."""

import sqlalchemy as sa
from alembic import op

revision = "3"
down_revision = "2"

COLUMNS = (
    ("device", sa.String(64)),
    ("fingerprint", sa.String(64)),
    ("duplicate_of", sa.Integer()),
    ("memory_argument_bytes", sa.BigInteger()),
    ("memory_output_bytes", sa.BigInteger()),
    ("memory_temp_bytes", sa.BigInteger()),
    ("memory_peak_bytes", sa.BigInteger()),
)


def upgrade() -> None:
    for name, type_ in COLUMNS:
        op.add_column("autotune_trials", sa.Column(name, type_, nullable=True))
