"""Help requests of robots (issue 33's help requests part).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-04
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "help_requests",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column(
            "robot_id",
            sa.Integer(),
            sa.ForeignKey("robots.id", name="fk_help_requests_robot_id_robots"),
            nullable=False,
        ),
        sa.Column("key", sa.String(128), nullable=False),
        sa.Column("episode_index", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("risk", sa.Double(), nullable=False),
        sa.Column("timeout_s", sa.Double(), nullable=False),
        sa.Column("requested_at", TS, nullable=False),
        sa.Column("answered_at", TS),
        sa.Column("answered_by", sa.String(128), nullable=False),
        sa.Column("outcome", sa.String(16)),
        sa.Column("wait_s", sa.Double()),
        sa.Column("takeover_steps", sa.Integer(), nullable=False),
        sa.Column("label", sa.String(16), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_help_requests"),
        sa.UniqueConstraint("run_id", "robot_id", "key", name="uq_help_requests_run_id"),
    )
    op.create_index("ix_help_requests_run_id", "help_requests", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_help_requests_run_id", "help_requests")
    op.drop_table("help_requests")
