"""Reading and writing run metrics (``robofleet.db.auth_models.Metric``) for charts.

The learner and run manager write with :func:`insert_metrics`; the dashboard reads with
:func:`metrics_after`, which returns points in insertion order so a stream can resume from the
last id it sent (Server-Sent Events' ``Last-Event-ID``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import select

from robofleet.db.auth_models import Metric
from robofleet.db.store import MetadataStore


def insert_metrics(store: MetadataStore, run_id: str, points: Iterable[Mapping[str, Any]]) -> int:
    """Insert points ``{"name", "step", "value", "wall_time"?, "robot_id"?, "task"?}`` in one
    transaction; returns how many. ``wall_time`` defaults to now (seconds since the epoch)."""
    now = time.time()
    rows = [
        Metric(
            run_id=run_id,
            name=str(p["name"]),
            step=int(p["step"]),
            value=float(p["value"]),
            wall_time=float(p.get("wall_time", now)),
            robot_id=p.get("robot_id"),
            task=p.get("task"),
        )
        for p in points
    ]
    with store.session() as s:
        s.add_all(rows)
    return len(rows)


def metrics_after(
    store: MetadataStore,
    run_id: str,
    after_id: int = 0,
    limit: int = 5000,
    name: str | None = None,
    tail: bool = False,
) -> list[dict[str, Any]]:
    """Points of ``run_id`` with id > ``after_id``, oldest first, at most ``limit``.

    With ``tail=True`` the *newest* ``limit`` points are returned (still oldest first): a new
    chart starts from recent history instead of the run's first hours.
    """
    q = select(Metric).where(Metric.run_id == run_id, Metric.id > after_id)
    if name is not None:
        q = q.where(Metric.name == name)
    q = q.order_by(Metric.id.desc() if tail else Metric.id).limit(limit)
    with store.session() as s:
        rows = list(s.scalars(q))
    if tail:
        rows.reverse()
    return [
        {
            "id": m.id,
            "name": m.name,
            "step": m.step,
            "wall_time": m.wall_time,
            "value": m.value,
            "robot_id": m.robot_id,
            "task": m.task,
        }
        for m in rows
    ]
