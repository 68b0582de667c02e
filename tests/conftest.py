"""Suite-wide set-up: nothing reaches beyond loopback, nothing downloads from a hub."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ.setdefault("MUJOCO_GL", "egl")

PG_URL = os.environ.get("ROBOFLEET_TEST_PG_URL", "")


def _postgres_param() -> object:
    # `make test` runs the suite under tools/with-postgres, which sets the URL; a bare pytest
    # without it skips these (in CI their absence is a failure, not a skip).
    if PG_URL or os.environ.get("CI"):
        return pytest.param("postgres", marks=pytest.mark.postgres)
    return pytest.param(
        "postgres",
        marks=[
            pytest.mark.postgres,
            pytest.mark.skip(
                reason="ROBOFLEET_TEST_PG_URL not set (make test, or tools/with-postgres pytest ...)"
            ),
        ],
    )


@pytest.fixture(params=["sqlite", _postgres_param()])
def db_url(request: pytest.FixtureRequest, tmp_path: pytest.TempPathFactory) -> Iterator[str]:
    """An empty database URL: SQLite in a temp dir, or a fresh database on the test PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/meta.db"
        return
    assert PG_URL, "CI must export ROBOFLEET_TEST_PG_URL (make test starts PostgreSQL)"
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(PG_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


# The system test files whose real cloud (Ray, simulated robot computers, learner processes) keeps
# both cores busy. Under pytest-xdist (`make test`: -n 2 --dist loadfile) they share one worker, one
# file after another, so two such clouds never starve each other's robots and learners while the
# other worker takes the rest of the suite.
CLOUD_FILES = frozenset(
    f"tests/{path}.py"
    for path in (
        "hal/test_multinode",
        "robofleet/test_bench_fleet_hosts",
        "robofleet/test_bench_operators",
        "robofleet/test_bench_soak",
        "runs/test_algorithms_runs",
        "runs/test_classifier_run",
        "runs/test_cloud_runs",
        "runs/test_lerobot_actors",
        "runs/test_pause_and_hang",
        "runs/test_pixel_and_chunk_runs",
        "runs/test_refused_resume",
        "runs/test_robot_computers",
        "runs/test_sharded_runs",
    )
)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadfile`` with ``CLOUD_FILES`` as one unit of work: each file on one worker (its
    module fixtures set up once), those files together. xdist's own ``--dist loadgroup`` cannot
    do this here: it tags node ids, which pytest 9 no longer lets a plugin rewrite."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LoadFileWithCloudGroup(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "cloud" if path in CLOUD_FILES else path

    return LoadFileWithCloudGroup(config, log)
