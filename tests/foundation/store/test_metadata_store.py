import threading
from datetime import timedelta

import pytest
from sqlalchemy import select

from foundation.store.metadata_store import (
    EnrollmentError,
    LeaseConflict,
    MetadataStore,
    upgrade,
)
from foundation.store.models import Event, Robot, RobotStatus, Run


@pytest.fixture
def store(db_url: str):
    upgrade(db_url)
    s = MetadataStore(db_url)
    yield s
    s.close()


def _robot(store: MetadataStore, name: str, status: RobotStatus = RobotStatus.IDLE) -> int:
    with store.session() as s:
        r = Robot(name=name, robot_type="metaworld-sawyer", status=status)
        s.add(r)
        s.flush()
        return r.id


def _run(store: MetadataStore, run_id: str) -> None:
    with store.session() as s:
        s.add(Run(id=run_id, algorithm="hg-dagger"))


def test_enrollment_token_is_one_time(store: MetadataStore) -> None:
    tok = store.create_enrollment_token(timedelta(minutes=5))
    robot, cred = store.consume_enrollment_token(
        tok, robot_name="r1", robot_type="metaworld-sawyer", spec={"fps": 20}
    )
    assert robot.name == "r1" and robot.spec == {"fps": 20}
    assert store.robot_for_credential(cred).id == robot.id  # type: ignore[union-attr]
    assert store.robot_for_credential("forged") is None
    with pytest.raises(EnrollmentError, match="already used"):
        store.consume_enrollment_token(tok, robot_name="r2", robot_type="x", spec={})
    with pytest.raises(EnrollmentError, match="unknown"):
        store.consume_enrollment_token("nope", robot_name="r3", robot_type="x", spec={})
    with store.session() as s:
        assert s.scalar(select(Robot).where(Robot.name == "r2")) is None  # nothing half-created


def test_expired_token_refused(store: MetadataStore) -> None:
    tok = store.create_enrollment_token(timedelta(seconds=-1))
    with pytest.raises(EnrollmentError, match="expired"):
        store.consume_enrollment_token(tok, robot_name="r1", robot_type="x", spec={})


def test_retired_robot_credential_is_refused(store: MetadataStore) -> None:
    tok = store.create_enrollment_token(timedelta(minutes=5))
    robot, cred = store.consume_enrollment_token(tok, robot_name="r1", robot_type="x", spec={})
    with store.session() as s:
        s.get(Robot, robot.id).status = RobotStatus.RETIRED  # type: ignore[union-attr]
    assert store.robot_for_credential(cred) is None


def test_lease_all_or_nothing_and_release(store: MetadataStore) -> None:
    a, b, c = (_robot(store, n) for n in ("a", "b", "c"))
    _run(store, "run1")
    _run(store, "run2")
    store.lease_robots("run1", [a, b])
    with pytest.raises(LeaseConflict, match="already leased"):
        store.lease_robots("run2", [c, b])
    # c must not have been leased by the failed request
    assert {lease.robot_id for lease in store.active_leases("run2")} == set()
    with store.session() as s:
        assert s.get(Robot, c).status == RobotStatus.IDLE  # type: ignore[union-attr]
    assert store.release_leases("run1") == 2
    store.lease_robots("run2", [b, c])
    assert {lease.robot_id for lease in store.active_leases("run2")} == {b, c}
    with store.session() as s:
        kinds = [e.kind for e in s.scalars(select(Event).order_by(Event.id))]
    assert kinds.count("lease.acquired") == 4 and kinds.count("lease.released") == 2


def test_unschedulable_and_unknown_robots_refused(store: MetadataStore) -> None:
    stopped = _robot(store, "stopped", RobotStatus.ESTOPPED)
    _run(store, "run1")
    with pytest.raises(LeaseConflict, match="e-stopped"):
        store.lease_robots("run1", [stopped])
    with pytest.raises(LeaseConflict, match="no such robot"):
        store.lease_robots("run1", [9999])
    assert store.active_leases() == []


def test_concurrent_lease_exactly_one_wins(store: MetadataStore) -> None:
    """Two runs lease the same robot at the same moment on separate connections, many times."""
    rounds = 15
    robots = [_robot(store, f"r{i}") for i in range(rounds)]
    _run(store, "left")
    _run(store, "right")
    stores = [MetadataStore(store.url), MetadataStore(store.url)]
    for r in robots:
        barrier = threading.Barrier(2)
        outcome: dict[str, str] = {}

        def contend(
            run_id: str,
            st: MetadataStore,
            robot: int = r,
            bar: threading.Barrier = barrier,
            out: dict[str, str] = outcome,
        ) -> None:
            bar.wait()
            try:
                st.lease_robots(run_id, [robot])
                out[run_id] = "won"
            except LeaseConflict:
                out[run_id] = "lost"

        threads = [
            threading.Thread(target=contend, args=(rid, st))
            for rid, st in zip(("left", "right"), stores, strict=True)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert sorted(outcome.values()) == ["lost", "won"], outcome
        assert len([lease for lease in store.active_leases() if lease.robot_id == r]) == 1
    for st in stores:
        st.close()


def test_an_enrollment_token_never_starts_with_a_dash(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """``robofleet edge --token T`` would read a leading ``-`` as an option (1 in 64 tokens)."""
    from foundation.store import metadata_store

    drawn = iter(["-leading-dash", "_fine-token"])
    monkeypatch.setattr(metadata_store.secrets, "token_urlsafe", lambda n: next(drawn))
    assert metadata_store.command_line_token() == "_fine-token"
