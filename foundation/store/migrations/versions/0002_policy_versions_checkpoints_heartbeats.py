"""Policy versions, checkpoints, and robot heartbeat columns.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("robots") as batch:
        batch.add_column(sa.Column("last_heartbeat_at", TS))
        batch.add_column(sa.Column("applied_policy_version", sa.Integer()))
        # Existing robots get an empty stats object, not NULL.
        batch.add_column(
            sa.Column("stats", sa.JSON(), nullable=False, server_default=sa.text("'{}'"))
        )
    with op.batch_alter_table("robots") as batch:
        batch.alter_column("stats", server_default=None)
    op.create_table(
        "policy_versions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column(
            "run_id",
            sa.String(64),
            sa.ForeignKey("runs.id", name="fk_policy_versions_run_id_runs"),
            nullable=False,
        ),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("learner_step", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("num_bytes", sa.BigInteger(), nullable=False),
        sa.Column("promoted", sa.Boolean(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_policy_versions"),
    )
    op.create_index("ix_policy_versions_run_id", "policy_versions", ["run_id"])
    op.create_table(
        "checkpoints",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column(
            "run_id",
            sa.String(64),
            sa.ForeignKey("runs.id", name="fk_checkpoints_run_id_runs"),
            nullable=False,
        ),
        sa.Column("learner_step", sa.BigInteger(), nullable=False),
        sa.Column("policy_version", sa.Integer(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_checkpoints"),
    )
    op.create_index("ix_checkpoints_run_id", "checkpoints", ["run_id"])


def downgrade() -> None:
    op.drop_table("checkpoints")
    op.drop_table("policy_versions")
    with op.batch_alter_table("robots") as batch:
        batch.drop_column("stats")
        batch.drop_column("applied_policy_version")
        batch.drop_column("last_heartbeat_at")
