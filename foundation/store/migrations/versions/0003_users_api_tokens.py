"""Dashboard users, API/session tokens, and run metrics.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("username", sa.String(64), nullable=False),
        sa.Column("password_hash", sa.String(256), nullable=False),
        sa.Column(
            "role",
            sa.Enum("VIEWER", "OPERATOR", "ADMIN", name="role", native_enum=False, length=16),
            nullable=False,
        ),
        sa.Column("disabled", sa.Boolean(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("password_changed_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_users"),
        sa.UniqueConstraint("username", name="uq_users_username"),
    )
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column(
            "user_id",
            sa.Integer(),
            sa.ForeignKey("users.id", name="fk_api_tokens_user_id_users"),
            nullable=False,
        ),
        sa.Column(
            "kind",
            sa.Enum("SESSION", "API", name="tokenkind", native_enum=False, length=16),
            nullable=False,
        ),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("expires_at", TS),
        sa.Column("last_used_at", TS),
        sa.Column("revoked_at", TS),
        sa.PrimaryKeyConstraint("id", name="pk_api_tokens"),
        sa.UniqueConstraint("token_hash", name="uq_api_tokens_token_hash"),
    )
    op.create_index("ix_api_tokens_user_id", "api_tokens", ["user_id"])
    op.create_table(
        "metrics",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column(
            "run_id",
            sa.String(64),
            sa.ForeignKey("runs.id", name="fk_metrics_run_id_runs"),
            nullable=False,
        ),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("wall_time", sa.Double(), nullable=False),
        sa.Column("value", sa.Double(), nullable=False),
        sa.Column(
            "robot_id", sa.Integer(), sa.ForeignKey("robots.id", name="fk_metrics_robot_id_robots")
        ),
        sa.Column("task", sa.String(128)),
        sa.PrimaryKeyConstraint("id", name="pk_metrics"),
    )
    op.create_index("ix_metrics_run_id_name_step", "metrics", ["run_id", "name", "step"])


def downgrade() -> None:
    op.drop_index("ix_metrics_run_id_name_step", table_name="metrics")
    op.drop_table("metrics")
    op.drop_index("ix_api_tokens_user_id", table_name="api_tokens")
    op.drop_table("api_tokens")
    op.drop_table("users")
