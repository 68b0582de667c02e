"""Who of a run's operators a help request was assigned to, and when (issue 33's operators).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("help_requests") as batch:
        batch.add_column(
            sa.Column("assigned_to", sa.String(128), nullable=False, server_default="")
        )
        batch.add_column(sa.Column("assigned_at", TS))
        batch.add_column(sa.Column("released_at", TS))
    with op.batch_alter_table("help_requests") as batch:
        batch.alter_column("assigned_to", server_default=None)


def downgrade() -> None:
    with op.batch_alter_table("help_requests") as batch:
        batch.drop_column("released_at")
        batch.drop_column("assigned_at")
        batch.drop_column("assigned_to")
