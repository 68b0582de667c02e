"""Prometheus exposition of fleet, buffer and learner figures, read from the metadata store.

A custom collector queries the store at scrape time (nothing is cached between scrapes), so
every dashboard replica reports the same numbers. Run figures are the latest value of each
metric of runs that are not finished or stopped; metric names map to Prometheus names below.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry
from sqlalchemy import Row, func, select
from sqlalchemy.orm import Session

from foundation.store.metadata_store import MetadataStore
from foundation.store.metrics import Metric
from foundation.store.models import Lease, Robot, RobotStatus, Run, RunState

# metric name -> (prometheus name, help)
RUN_GAUGES: dict[str, tuple[str, str]] = {
    "success_rate": ("robofleet_run_success_rate", "Success rate per task (0-1)."),
    "intervention_rate": ("robofleet_run_intervention_rate", "Share of operator steps (0-1)."),
    "env_steps_per_s": ("robofleet_fleet_env_steps_per_second", "Environment steps per second."),
    "learner_updates_per_s": ("robofleet_learner_updates_per_second", "Gradient updates per s."),
    "loss": ("robofleet_learner_loss", "Training loss of the algorithm."),
    "buffer_size": ("robofleet_buffer_transitions", "Transitions held by the buffer."),
    "buffer_robot_steps": ("robofleet_buffer_robot_steps", "Buffer transitions from robots."),
    "buffer_offline_steps": (
        "robofleet_buffer_offline_steps",
        "Buffer transitions from demonstrations and other offline data.",
    ),
    "discarded_episodes": (
        "robofleet_run_discarded_episodes",
        "Episodes operators discarded or rerecorded (never trained on).",
    ),
    "cache_hit_rate": ("robofleet_buffer_cache_hit_ratio", "Buffer hot-cache hit ratio (0-1)."),
    "policy_version": ("robofleet_robot_policy_version", "Policy version applied on a robot."),
}
_LIVE = [s for s in RunState if s not in (RunState.STOPPED, RunState.FINISHED)]
# name, last_heartbeat_at, applied_policy_version, stats
_RobotRow = Row[str, datetime | None, int | None, dict[str, Any]]
# run_id, metric name, task, robot name (None, outer-joined: a run-level metric), value
_MetricRow = Row[str, str, str | None, str, float]


def _prom_name(name: str) -> str:
    return "robofleet_run_" + re.sub(r"[^a-zA-Z0-9_]", "_", name)


@dataclass
class _Snapshot:
    """The store's figures one scrape exports, read in one session."""

    robots_by_status: dict[RobotStatus, int]
    robots: Sequence[_RobotRow]
    leased: int | None
    runs_by_state: dict[RunState, int]
    latest: Sequence[_MetricRow]


def _read(s: Session) -> _Snapshot:
    by_status = dict(s.execute(select(Robot.status, func.count()).group_by(Robot.status)).all())
    robots = s.execute(
        select(Robot.name, Robot.last_heartbeat_at, Robot.applied_policy_version, Robot.stats)
    ).all()
    leased = s.scalar(select(func.count()).select_from(Lease).where(Lease.released_at.is_(None)))
    runs = dict(s.execute(select(Run.state, func.count()).group_by(Run.state)).all())
    # The newest row of each (run, metric, task, robot) series of the live runs.
    latest_ids = (
        select(func.max(Metric.id))
        .join(Run, Run.id == Metric.run_id)
        .where(Run.state.in_(_LIVE))
        .group_by(Metric.run_id, Metric.name, Metric.task, Metric.robot_id)
    )
    latest = s.execute(
        select(Metric.run_id, Metric.name, Metric.task, Robot.name, Metric.value)
        .outerjoin(Robot, Robot.id == Metric.robot_id)
        .where(Metric.id.in_(latest_ids))
    ).all()
    return _Snapshot(by_status, robots, leased, runs, latest)


def _counts(
    name: str, help_text: str, label: str, members: Iterable[Enum], counts: Mapping[Any, int]
) -> GaugeMetricFamily:
    """One gauge per enum member (0 where none), labelled with the member's value."""
    g = GaugeMetricFamily(name, help_text, labels=[label])
    for member in members:
        g.add_metric([member.value], float(counts.get(member, 0)))
    return g


def _robot_families(robots: Sequence[_RobotRow], now: float) -> Iterator[GaugeMetricFamily]:
    """Per-robot heartbeat age, control-loop p99 and applied policy version."""
    age = GaugeMetricFamily(
        "robofleet_robot_heartbeat_age_seconds", "Seconds since heartbeat.", labels=["robot"]
    )
    p99 = GaugeMetricFamily(
        "robofleet_robot_control_loop_p99_ms", "Control-loop p99 latency.", labels=["robot"]
    )
    applied = GaugeMetricFamily(
        "robofleet_robot_applied_policy_version", "Applied version.", labels=["robot"]
    )
    for name, hb, version, stats in robots:
        if hb is not None:
            hb = hb if hb.tzinfo else hb.replace(tzinfo=UTC)  # SQLite drops the zone
            age.add_metric([name], max(0.0, now - hb.timestamp()))
        value = stats.get("control_loop_p99_ms") if isinstance(stats, dict) else None
        if isinstance(value, int | float):
            p99.add_metric([name], float(value))
        if version is not None:
            applied.add_metric([name], float(version))
    yield from (age, p99, applied)


def _run_families(latest: Sequence[_MetricRow]) -> Iterator[GaugeMetricFamily]:
    """The live runs' latest metric values, one family per Prometheus name (RUN_GAUGES)."""
    families: dict[str, GaugeMetricFamily] = {}
    for run_id, mname, task, robot, value in latest:
        prom, help_text = RUN_GAUGES.get(mname, (_prom_name(mname), f"Latest {mname}."))
        fam = families.get(prom)
        if fam is None:
            fam = families[prom] = GaugeMetricFamily(
                prom, help_text, labels=["run", "task", "robot"]
            )
        fam.add_metric([run_id, task or "", robot or ""], float(value))
    yield from families.values()


class StoreCollector(Collector):
    def __init__(self, store: MetadataStore) -> None:
        self.store = store

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = time.time()
        with self.store.session() as s:
            snap = _read(s)
        yield _counts(
            "robofleet_robots", "Robots by status.", "status", RobotStatus, snap.robots_by_status
        )
        yield GaugeMetricFamily(
            "robofleet_leases_active", "Robots leased to runs.", value=float(snap.leased or 0)
        )
        yield _counts("robofleet_runs", "Runs by state.", "state", RunState, snap.runs_by_state)
        yield from _robot_families(snap.robots, now)
        yield from _run_families(snap.latest)


def make_registry(store: MetadataStore) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store))
    return registry
