from datetime import UTC, datetime

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

from foundation.store.metadata_store import current_revision, make_engine, upgrade
from foundation.store.models import Base


def test_models_match_migrations(db_url: str) -> None:
    upgrade(db_url)
    engine = make_engine(db_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    assert diff == []


def test_upgrade_from_first_migration_keeps_rows(db_url: str) -> None:
    upgrade(db_url, "0001")
    assert current_revision(db_url) == "0001"
    engine = make_engine(db_url)
    now = datetime.now(UTC).isoformat()
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO robots (name, robot_type, status, tags, spec, created_at) "
                "VALUES ('old-robot', 'so100', 'IDLE', '{}', '{\"fps\": 30}', :now)"
            ),
            {"now": now},
        )
        conn.execute(
            text(
                "INSERT INTO runs (id, name, algorithm, state, spec, run_dir, reason, created_at, updated_at) "
                "VALUES ('run-1', 'n', 'hg-dagger', 'RUNNING', '{}', '/d', '', :now, :now)"
            ),
            {"now": now},
        )
    engine.dispose()

    upgrade(db_url)
    assert current_revision(db_url) == "0006"
    engine = make_engine(db_url)
    with engine.connect() as conn:
        row = conn.execute(
            text("SELECT name, spec, stats, applied_policy_version FROM robots")
        ).one()
        runs = conn.execute(text("SELECT id, state FROM runs")).all()
        tables = set(inspect(conn).get_table_names())
    engine.dispose()
    assert row[0] == "old-robot"
    assert row[3] is None
    assert runs == [("run-1", "RUNNING")]
    assert {"policy_versions", "checkpoints"} <= tables
