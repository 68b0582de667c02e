"""Run metrics: the scalars charts and the Prometheus endpoint show (migration 0003).

The run driver and the learner write with :func:`insert_metrics`; the dashboard reads with
:func:`metrics_after`, which returns points in insertion order so a stream can resume from the
last id it sent (Server-Sent Events' ``Last-Event-ID``).

Names the dashboard knows (``METRIC_NAMES``), with their labels:

=======================  =========  ===============================================
name                     labels     meaning (unit)
=======================  =========  ===============================================
``success_rate``         task       fraction of evaluation/rollout episodes solved (0-1)
``intervention_rate``    task?      fraction of steps where an operator acted (0-1)
``env_steps_per_s``      robot?     environment steps per second, fleet or one robot
``learner_updates_per_s``           gradient updates per second
``loss``                            the algorithm's training loss
``buffer_size``                     transitions held by the buffer (robots' and offline)
``buffer_robot_steps``              of them, the robots' steps
``buffer_offline_steps``            of them, demonstrations and other offline rows
``discarded_episodes``              episodes operators discarded or rerecorded (never trained on)
``cache_hit_rate``                  buffer hot-cache hit ratio (0-1)
``policy_version``       robot      policy version applied on a robot
``operator_minutes``                minutes the run's operators were busy (runs.operator_effort)
``autonomous_successes``            the robots' autonomous successes so far
``return_on_human_effort``          autonomous successes per operator minute
=======================  =========  ===============================================
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from sqlalchemy import BigInteger, Double, ForeignKey, Index, Integer, String, select
from sqlalchemy.orm import Mapped, mapped_column

from foundation.store.base import Base

if TYPE_CHECKING:
    from foundation.store.metadata_store import MetadataStore

METRIC_NAMES = (
    "success_rate",
    "intervention_rate",
    "env_steps_per_s",
    "learner_updates_per_s",
    "loss",
    "buffer_size",
    "buffer_robot_steps",
    "buffer_offline_steps",
    "discarded_episodes",
    "cache_hit_rate",
    "policy_version",
    "operator_minutes",
    "autonomous_successes",
    "return_on_human_effort",
)


class Metric(Base):
    """One scalar of a run at a learner step (TensorBoard's scalar shape plus fleet labels).

    ``wall_time`` is seconds since the Unix epoch (float), ``step`` the learner update count
    (or env step for fleet figures). ``robot_id`` / ``task`` are optional labels.
    """

    __tablename__ = "metrics"
    __table_args__ = (Index("ix_metrics_run_id_name_step", "run_id", "name", "step"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"))
    name: Mapped[str] = mapped_column(String(64))
    step: Mapped[int] = mapped_column(BigInteger)
    wall_time: Mapped[float] = mapped_column(Double)
    value: Mapped[float] = mapped_column(Double)
    robot_id: Mapped[int | None] = mapped_column(ForeignKey("robots.id"))
    task: Mapped[str | None] = mapped_column(String(128))


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
