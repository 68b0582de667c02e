"""A run's robots leased beside its learner's Ray resources (``hal.scheduler``), and the
enrolled specs of the leased robots (their common features, the evaluator's driver kind)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from foundation.runspec import RunSpec
from foundation.store.metadata_store import MetadataStore


def allocation_for(store: MetadataStore, run_id: str, spec: RunSpec) -> Any:
    """The ``hal.scheduler.RobotAllocation`` the spec asks for (robots and learner), not
    acquired yet; leases left by a cloud that died (stale) are given back first."""
    from hal.scheduler import LearnerRequest, RobotAllocation, RobotRequest

    store.release_leases(run_id, actor="run-manager")
    return RobotAllocation(
        store,
        run_id,
        RobotRequest(
            count=spec.robots.count,
            robot_type=spec.robots.robot_type,
            tags=dict(spec.robots.tags),
            min_count=spec.robots.min_count,
        ),
        LearnerRequest(spec.learner.num_cpus, spec.learner.num_gpus),
        actor="run-manager",
    )


def acquire(allocation: Any, hal: Any, patient: bool) -> None:
    """Acquire ``allocation``; ``patient`` (after a cloud restart robots may be offline until
    their next heartbeat) tries again for ``3 * hal.offline_after_s`` seconds.

    Raises:
        hal.scheduler.SchedulingError: not enough robots or no learner placement, in time.
    """
    from hal.scheduler import SchedulingError

    deadline = time.monotonic() + (3 * hal.offline_after_s if patient else 0)
    while True:
        try:
            allocation.acquire(timeout_s=hal.placement_timeout_s)
            return
        except SchedulingError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


def robot_specs(store: MetadataStore, names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Name -> enrolled spec (a dict) of each robot of ``names``."""
    from sqlalchemy import select

    from foundation.store.models import Robot

    with store.session() as s:
        rows = s.execute(select(Robot.name, Robot.spec).where(Robot.name.in_(list(names))))
        return {name: dict(spec or {}) for name, spec in rows}


def members(allocation: Any) -> dict[str, int]:
    """Name -> robot id of each robot ``allocation`` holds a lease on."""
    return {name: m.robot_id for name, m in allocation.members.items()}
