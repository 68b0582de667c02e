"""Metadata retention keeps the append-only tables bounded and keeps what must stay: a metric
curve's start and its recent points, rare event kinds, people's audit events, active leases,
promoted versions. SQLite and PostgreSQL (``db_url``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import func, select

from cloud_learner.loop import PUBLISHED
from comms.cloud.weight_file import WeightDirectory
from foundation.store.base import utcnow
from foundation.store.config import MetadataRetentionSettings
from foundation.store.metadata_store import MetadataStore, upgrade
from foundation.store.metrics import Metric, insert_metrics
from foundation.store.models import Checkpoint, Event, Lease, PolicyVersion, Robot, Run
from foundation.store.retention import prune, thinned
from runs.versions import VersionRecorder


@pytest.fixture
def store(db_url: str) -> Iterator[MetadataStore]:
    upgrade(db_url)
    s = MetadataStore(db_url)
    with s.session() as sess:
        sess.add(Run(id="run-1", algorithm="hg-dagger"))
        sess.add(Robot(id=1, name="r1", robot_type="sim"))
        sess.add(Robot(id=2, name="r2", robot_type="sim"))
    yield s
    s.close()


def caps(**kw: int) -> MetadataRetentionSettings:
    base = dict(
        metric_points_per_series=40,
        events_per_kind=10,
        released_leases_per_robot=3,
        checkpoint_rows_per_run=5,
        version_rows_per_run=40,
    )
    return MetadataRetentionSettings(**{**base, **kw})


def test_thinned_keeps_the_start_and_the_newest_half() -> None:
    ids = list(range(100))
    doomed = set(thinned(ids, 40))
    kept = [i for i in ids if i not in doomed]
    assert thinned(ids[:40], 40) == []
    assert kept[0] == 0 and kept[-20:] == ids[-20:]
    assert 30 <= len(kept) <= 40
    # Repeated thinning of a growing series stays within the cap.
    series = list(range(40))
    for start in range(40, 2000, 17):
        series += list(range(start, start + 17))
        doomed = set(thinned(series, 40))
        series = [i for i in series if i not in doomed]
        assert len(series) <= 40 and series[0] == 0


def metric_steps(store: MetadataStore, robot_id: int | None) -> list[int]:
    robot = Metric.robot_id.is_(None) if robot_id is None else Metric.robot_id == robot_id
    with store.session() as s:
        return list(s.scalars(select(Metric.step).where(robot).order_by(Metric.id)))


def test_metric_series_are_thinned_each_on_its_own(store: MetadataStore) -> None:
    points = [{"name": "loss", "step": i, "value": 1.0, "robot_id": 1} for i in range(100)]
    points += [{"name": "loss", "step": i, "value": 1.0} for i in range(100)]  # robot NULL
    points += [{"name": "loss", "step": i, "value": 1.0, "robot_id": 2} for i in range(30)]
    insert_metrics(store, "run-1", points)
    got = prune(store, caps())
    assert got.metrics == 2 * len(thinned(list(range(100)), 40))
    for robot in (1, None):
        steps = metric_steps(store, robot)
        assert 30 <= len(steps) <= 40 and steps[0] == 0 and steps[-20:] == list(range(80, 100))
    assert metric_steps(store, 2) == list(range(30))  # under its cap: untouched
    assert prune(store, caps()).metrics == 0  # a second pass finds nothing over the cap


def test_events_keep_rare_kinds_and_every_persons_event(store: MetadataStore) -> None:
    with store.session() as s:
        for i in range(50):
            store.record_event("learner.published", run_id="run-1", session=s, version=i)
            store.record_event("robot.status", robot_id=1, session=s, n=i)
            store.record_event("run.paused", actor="user:alice", run_id="run-1", session=s)
            store.record_event("lease.released", actor="run-manager", run_id="run-1", session=s)
        for _ in range(3):
            store.record_event("run.resuming", run_id="run-1", session=s)
    got = prune(store, caps())
    assert got.events == 3 * 40  # the run manager's events are a machine's, capped too
    with store.session() as s:
        counts = dict(s.execute(select(Event.kind, func.count()).group_by(Event.kind)).all())
        versions = [
            e.data["version"]
            for e in s.scalars(select(Event).where(Event.kind == "learner.published"))
        ]
    assert counts == {
        "learner.published": 10,
        "lease.released": 10,
        "robot.status": 10,
        "run.paused": 50,
        "run.resuming": 3,
    }
    assert sorted(versions) == list(range(40, 50))  # the newest


def test_released_leases_are_capped_and_the_active_one_kept(store: MetadataStore) -> None:
    with store.session() as s:
        for i in range(12):
            s.add(Lease(run_id="run-1", robot_id=1, released_at=utcnow() + timedelta(seconds=i)))
        s.add(Lease(run_id="run-1", robot_id=1))  # active
        s.add(Lease(run_id="run-1", robot_id=2, released_at=utcnow()))
    assert prune(store, caps()).leases == 9
    assert [lease.robot_id for lease in store.active_leases("run-1")] == [1]
    with store.session() as s:
        assert s.scalar(select(func.count()).select_from(Lease)) == 3 + 1 + 1


def test_checkpoint_and_version_rows_are_bounded_promoted_kept(store: MetadataStore) -> None:
    with store.session() as s:
        for step in range(20):
            s.add(Checkpoint(run_id="run-1", learner_step=step, policy_version=step, path="p"))
        for v in range(1, 101):
            s.add(PolicyVersion(run_id="run-1", version=v, promoted=v == 2))
    got = prune(store, caps())
    with store.session() as s:
        steps = sorted(s.scalars(select(Checkpoint.learner_step)))
        versions = sorted(s.scalars(select(PolicyVersion.version)))
    assert got.checkpoints == 15 and steps == list(range(15, 20))
    assert 2 in versions and versions[0] == 1 and versions[-20:] == list(range(81, 101))
    # the promoted one is kept beyond the cap
    assert len(versions) <= 40 + 1 and got.policy_versions == 100 - len(versions)


def test_a_pruned_version_is_not_recorded_again_after_a_cloud_restart(
    tmp_path: Path, store: MetadataStore
) -> None:
    run_dir = tmp_path / "run"
    weights = WeightDirectory(run_dir / "weights", keep=2)
    with (run_dir / PUBLISHED).open("a") as f:
        for v in range(1, 61):
            f.write(json.dumps({"version": v, "learner_step": v, "num_bytes": 8}) + "\n")
    weights.publish(60, {"w": np.zeros(2, np.float32)})
    VersionRecorder(store, "run-1", run_dir).poll()
    prune(store, caps())
    with store.session() as s:
        kept = sorted(s.scalars(select(PolicyVersion.version)))
    assert len(kept) < 60
    VersionRecorder(store, "run-1", run_dir).poll()  # reads the whole journal again
    with store.session() as s:
        assert sorted(s.scalars(select(PolicyVersion.version))) == kept
