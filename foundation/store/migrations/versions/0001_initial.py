"""Initial schema: sites, robots, enrollment tokens, runs, leases, events.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    # Longer than 60 lines on purpose: one declarative list of the initial tables and their
    # indexes in foreign-key order, a frozen record of the schema (it must not follow later
    # model changes, so it names no model); split per table it would only scatter that record.
    op.create_table(
        "sites",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_sites"),
        sa.UniqueConstraint("name", name="uq_sites_name"),
    )
    op.create_table(
        "robots",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("robot_type", sa.String(128), nullable=False),
        sa.Column(
            "site_id", sa.Integer(), sa.ForeignKey("sites.id", name="fk_robots_site_id_sites")
        ),
        sa.Column(
            "status",
            sa.Enum(
                "ENROLLED",
                "IDLE",
                "LEASED",
                "OFFLINE",
                "ESTOPPED",
                "UNHEALTHY",
                "RETIRED",
                name="robotstatus",
                native_enum=False,
                length=16,
            ),
            nullable=False,
        ),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("credential_hash", sa.String(64)),
        sa.Column("created_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_robots"),
        sa.UniqueConstraint("name", name="uq_robots_name"),
        sa.UniqueConstraint("credential_hash", name="uq_robots_credential_hash"),
    )
    op.create_index("ix_robots_robot_type", "robots", ["robot_type"])
    op.create_table(
        "enrollment_tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("robot_name", sa.String(128)),
        sa.Column("robot_type", sa.String(128)),
        sa.Column(
            "site_id",
            sa.Integer(),
            sa.ForeignKey("sites.id", name="fk_enrollment_tokens_site_id_sites"),
        ),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("expires_at", TS, nullable=False),
        sa.Column("used_at", TS),
        sa.Column(
            "used_by_robot_id",
            sa.Integer(),
            sa.ForeignKey("robots.id", name="fk_enrollment_tokens_used_by_robot_id_robots"),
        ),
        sa.PrimaryKeyConstraint("id", name="pk_enrollment_tokens"),
        sa.UniqueConstraint("token_hash", name="uq_enrollment_tokens_token_hash"),
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("algorithm", sa.String(32), nullable=False),
        sa.Column(
            "state",
            sa.Enum(
                "PENDING",
                "RUNNING",
                "DEGRADED",
                "PAUSED",
                "STOPPING",
                "STOPPED",
                "CRASHED",
                "RESUMING",
                "FINISHED",
                name="runstate",
                native_enum=False,
                length=16,
            ),
            nullable=False,
        ),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("run_dir", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_runs"),
    )
    op.create_index("ix_runs_state", "runs", ["state"])
    op.create_table(
        "leases",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column(
            "run_id",
            sa.String(64),
            sa.ForeignKey("runs.id", name="fk_leases_run_id_runs"),
            nullable=False,
        ),
        sa.Column(
            "robot_id",
            sa.Integer(),
            sa.ForeignKey("robots.id", name="fk_leases_robot_id_robots"),
            nullable=False,
        ),
        sa.Column("acquired_at", TS, nullable=False),
        sa.Column("released_at", TS),
        sa.PrimaryKeyConstraint("id", name="pk_leases"),
    )
    op.create_index("ix_leases_run_id", "leases", ["run_id"])
    op.create_index(
        "uq_leases_active_robot",
        "leases",
        ["robot_id"],
        unique=True,
        sqlite_where=sa.text("released_at IS NULL"),
        postgresql_where=sa.text("released_at IS NULL"),
    )
    op.create_table(
        "events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("run_id", sa.String(64)),
        sa.Column("robot_id", sa.Integer()),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_events"),
    )
    op.create_index("ix_events_created_at", "events", ["created_at"])
    op.create_index("ix_events_kind", "events", ["kind"])
    op.create_index("ix_events_run_id", "events", ["run_id"])


def downgrade() -> None:
    for table in ("events", "leases", "runs", "enrollment_tokens", "robots", "sites"):
        op.drop_table(table)
