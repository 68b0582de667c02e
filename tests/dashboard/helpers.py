"""Rows the tests need that only other components create (robots, policy versions...)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from robofleet.store.models import Robot, RobotStatus
from robofleet.store.store import MetadataStore

VALID_SPEC: dict[str, Any] = {
    "name": "sawyer-dagger",
    "algorithm": "hg-dagger",
    "tasks": ["reach-v3", "pick-place-v3"],
    "robots": {"robot_type": "metaworld-sawyer", "count": 2},
    "policy": {"kind": "mlp", "hidden_sizes": [128, 128]},
    "hyperparameters": {"batch_size": 64, "lr": 0.001},
}


def add_robot(store: MetadataStore, name: str, status: RobotStatus = RobotStatus.IDLE) -> int:
    with store.session() as s:
        r = Robot(name=name, robot_type="metaworld-sawyer", status=status)
        s.add(r)
        s.flush()
        return r.id


def count(store: MetadataStore, model: type) -> int:
    with store.session() as s:
        return int(s.scalar(select(func.count()).select_from(model)) or 0)
