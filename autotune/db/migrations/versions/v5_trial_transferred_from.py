"""v5: a trial measured first because other device kinds' results ranked it best (transfer,
autotune.search.transfer) names those device kinds (`transferred_from`, comma-separated).
Nullable: older trials, and those the search chose from this device's own, read as None."""

import sqlalchemy as sa
from alembic import op

revision = "5"
down_revision = "4"

COLUMNS = (("transferred_from", sa.Text()),)


def upgrade() -> None:
    for name, type_ in COLUMNS:
        op.add_column("autotune_trials", sa.Column(name, type_, nullable=True))
