"""Rows the tests need that only other components create (robots, policy versions...)."""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import func, select

from foundation.store.metadata_store import MetadataStore
from foundation.store.models import Robot, RobotStatus

VALID_SPEC: dict[str, Any] = {
    "name": "sawyer-dagger",
    "algorithm": "hg-dagger",
    "tasks": ["reach-v3", "pick-place-v3"],
    "robots": {"robot_type": "metaworld-sawyer", "count": 2},
    "policy": {"kind": "mlp", "hidden_sizes": [128, 128]},
    "hyperparameters": {"batch_size": 64, "lr": 0.001},
}


@functools.cache
def sawyer_spec() -> dict[str, Any]:
    """What a simulated Meta-World Sawyer's robot computer enrolls with."""
    from hal.drivers.metaworld import MetaWorldDriver, v3_tasks

    spec = MetaWorldDriver("spec", tasks=v3_tasks()).spec.to_dict()
    return {**spec, "computer": {"driver": "metaworld", "operator": "scripted"}}


def add_robot(store: MetadataStore, name: str, status: RobotStatus = RobotStatus.IDLE) -> int:
    """A Meta-World Sawyer in the fleet, as its robot computer enrolled it."""
    with store.session() as s:
        r = Robot(name=name, robot_type="metaworld-sawyer", status=status, spec=sawyer_spec())
        s.add(r)
        s.flush()
        return r.id


def count(store: MetadataStore, model: type) -> int:
    with store.session() as s:
        return int(s.scalar(select(func.count()).select_from(model)) or 0)
