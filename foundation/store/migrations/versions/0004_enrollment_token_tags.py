"""Tags an enrollment token gives the robot that uses it.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("enrollment_tokens") as batch:
        batch.add_column(
            sa.Column("tags", sa.JSON(), nullable=False, server_default=sa.text("'{}'"))
        )
    with op.batch_alter_table("enrollment_tokens") as batch:
        batch.alter_column("tags", server_default=None)


def downgrade() -> None:
    with op.batch_alter_table("enrollment_tokens") as batch:
        batch.drop_column("tags")
