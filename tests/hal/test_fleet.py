"""Fleet status in the metadata store: probe reports, heartbeats, offline marking, audit."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from foundation.store.metadata_store import MetadataStore, upgrade
from foundation.store.models import Event, Robot, RobotStatus, Run, utcnow
from hal.fleet import RobotReport, heartbeat, list_robots, mark_offline, report_robots, set_status


@pytest.fixture
def store(db_url: str):
    upgrade(db_url)
    s = MetadataStore(db_url)
    yield s
    s.close()


def _report(name: str) -> RobotReport:
    spec = {"robot_type": "metaworld-sawyer", "control_hz": 80.0}
    return RobotReport(name=name, driver="metaworld", robot_type="metaworld-sawyer", spec=spec)


def _statuses(store: MetadataStore) -> dict[str, RobotStatus]:
    return {r.name: r.status for r in list_robots(store)}


def _status_events(store: MetadataStore) -> list[tuple[str, str, str]]:
    with store.session() as s:
        evs = s.scalars(select(Event).where(Event.kind == "robot.status").order_by(Event.id))
        return [(e.data["robot"], e.data["from"], e.data["to"]) for e in evs]


def test_report_upserts_with_spec_and_node(store: MetadataStore) -> None:
    report_robots(store, [_report("a"), _report("b")], node="n1", node_ip="10.0.0.2")
    assert _statuses(store) == {"a": RobotStatus.IDLE, "b": RobotStatus.IDLE}
    set_status(store, "a", RobotStatus.ESTOPPED, "operator")
    report_robots(store, [_report("a")], node="n2", node_ip=None)
    (a,) = [r for r in list_robots(store) if r.name == "a"]
    assert a.tags["node"] == "n2" and "node_ip" not in a.tags
    assert a.spec["control_hz"] == 80.0
    assert a.status == RobotStatus.ESTOPPED  # a re-report never clears an e-stop
    with store.session() as s:
        kinds = [e.kind for e in s.scalars(select(Event))]
    assert kinds.count("robot.discovered") == 2 and kinds.count("robot.reported") == 1
    with pytest.raises(ValueError, match="robot name 'bad name'"):
        report_robots(store, [_report("ok2"), _report("bad name")], node="n", node_ip=None)
    assert "ok2" not in _statuses(store)


def test_heartbeats_drive_status_and_audit(store: MetadataStore) -> None:
    report_robots(store, [_report("a"), _report("b")], node="n", node_ip=None)
    t0 = utcnow()
    heartbeat(store, "a", now=t0)
    heartbeat(store, "b", now=t0)
    assert mark_offline(store, 10.0, now=t0 + timedelta(seconds=5)) == []
    heartbeat(store, "a", now=t0 + timedelta(seconds=8))
    assert mark_offline(store, 10.0, now=t0 + timedelta(seconds=12)) == ["b"]
    assert _statuses(store) == {"a": RobotStatus.IDLE, "b": RobotStatus.OFFLINE}
    assert heartbeat(store, "b", now=t0 + timedelta(seconds=13)) == RobotStatus.IDLE
    assert heartbeat(store, "a", estopped=True) == RobotStatus.ESTOPPED
    assert heartbeat(store, "b", healthy=False) == RobotStatus.UNHEALTHY
    assert heartbeat(store, "a") == RobotStatus.IDLE  # released on the robot by a person
    set_status(store, "b", RobotStatus.RETIRED, "decommissioned")
    assert heartbeat(store, "b") == RobotStatus.RETIRED
    assert _status_events(store) == [
        ("b", "idle", "offline"),
        ("b", "offline", "idle"),
        ("a", "idle", "estopped"),
        ("b", "idle", "unhealthy"),
        ("a", "estopped", "idle"),
        ("b", "unhealthy", "retired"),
    ]
    with pytest.raises(KeyError, match="no robot named 'ghost'"):
        heartbeat(store, "ghost")


def test_lost_leased_robot_returns_to_its_run(store: MetadataStore) -> None:
    report_robots(store, [_report("a")], node="n", node_ip=None)
    with store.session() as s:
        s.add(Run(id="run1", algorithm="hg-dagger"))
        rid = s.scalar(select(Robot.id).where(Robot.name == "a"))
    assert rid is not None
    store.lease_robots("run1", [rid])
    t0 = utcnow()
    heartbeat(store, "a", now=t0)
    assert mark_offline(store, 1.0, now=t0 + timedelta(seconds=2)) == ["a"]
    assert len(store.active_leases("run1")) == 1  # the lease waits for the robot
    assert heartbeat(store, "a", now=t0 + timedelta(seconds=3)) == RobotStatus.LEASED
