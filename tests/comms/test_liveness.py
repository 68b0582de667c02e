from pathlib import Path

from comms.cloud.liveness import record_heartbeat
from foundation.store.metadata_store import MetadataStore, upgrade
from foundation.store.models import Robot, RobotStatus, Run


def _store(tmp_path: Path) -> MetadataStore:
    url = f"sqlite:///{tmp_path}/meta.db"
    upgrade(url)
    return MetadataStore(url)


def test_heartbeat_after_offline_returns_leased_robot_to_its_run(tmp_path: Path) -> None:
    store = _store(tmp_path)
    with store.session() as s:
        s.add(Run(id="run1", algorithm="hg-dagger"))
        held = Robot(name="held", robot_type="sim", status=RobotStatus.IDLE)
        free = Robot(name="free", robot_type="sim", status=RobotStatus.OFFLINE)
        s.add_all([held, free])
        s.flush()
        held_id, free_id = held.id, free.id
    store.lease_robots("run1", [held_id])
    with store.session() as s:
        s.get(Robot, held_id).status = RobotStatus.OFFLINE  # type: ignore[union-attr]

    record_heartbeat(store, held_id, "running", 3, {"control_loop_p99_ms": 4.0})
    record_heartbeat(store, free_id, "running", None, {})

    with store.session() as s:
        held_row = s.get(Robot, held_id)
        free_row = s.get(Robot, free_id)
        assert held_row is not None and free_row is not None
        assert held_row.status == RobotStatus.LEASED
        assert held_row.applied_policy_version == 3
        assert held_row.stats["control_loop_p99_ms"] == 4.0
        assert free_row.status == RobotStatus.IDLE
    store.close()
