"""Leasing robots beside the learner's Ray bundle on a real (single-node) Ray.

Robots are not Ray resources: the Ray node below offers only CPUs, and the scheduler's promise
is leases (all or none, never an e-stopped, offline or leased robot) plus the learner's bundle,
both or neither.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import ray
from sqlalchemy import select

from foundation.store.metadata_store import MetadataStore, upgrade
from foundation.store.models import Robot, RobotStatus, Run, utcnow
from hal.fleet import RobotReport, heartbeat, mark_offline, report_robots, set_status
from hal.scheduler import LearnerRequest, RobotAllocation, RobotRequest, SchedulingError

ROBOTS = [f"sawyer-{i}" for i in range(4)]
TYPE = "metaworld-sawyer"
NODE_CPUS = 4.0


@pytest.fixture(scope="module")
def ray_node() -> Iterator[str]:
    ray.init(num_cpus=int(NODE_CPUS), include_dashboard=False, log_to_driver=False)
    try:
        yield ray.util.get_node_ip_address()
    finally:
        ray.shutdown()


@pytest.fixture
def store(tmp_path: Path, ray_node: str) -> Iterator[MetadataStore]:
    url = f"sqlite:///{tmp_path}/meta.db"
    upgrade(url)
    s = MetadataStore(url)
    reports = [
        RobotReport(n, "metaworld", TYPE, {"robot_type": TYPE}, tags={"site": "lab"})
        for n in ROBOTS
    ]
    report_robots(s, reports, node="head", node_ip=ray_node)
    with s.session() as sess:
        for run in ("run-a", "run-b"):
            sess.add(Run(id=run, algorithm="hg-dagger"))
    yield s
    s.close()


def enroll(store: MetadataStore, name: str, tags: dict[str, str] | None = None) -> None:
    """A robot computer that enrolled over gRPC (a token, no probe, no Ray node, no node_ip)."""
    tok = store.create_enrollment_token(timedelta(minutes=5), tags=tags)
    store.consume_enrollment_token(tok, robot_name=name, robot_type=TYPE, spec={})


def wait_available_cpus(expected: float, what: str) -> None:
    """Ray frees (and reports) a removed group's bundles asynchronously: poll for ``expected``."""
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU", 0.0) != expected:
        assert time.monotonic() < deadline, (
            f"{what}: available CPU {ray.available_resources().get('CPU')} != {expected}"
        )
        time.sleep(0.1)


class _LearnerProbe:
    def group(self) -> str | None:
        return ray.get_runtime_context().get_placement_group_id()


LearnerProbe: Any = ray.remote(num_cpus=0.5)(_LearnerProbe)  # Ray's actor class is untyped


def test_acquire_leases_all_never_unschedulable_robots_and_reserves_the_learner(
    store: MetadataStore,
) -> None:
    set_status(store, "sawyer-0", RobotStatus.ESTOPPED, "test")
    set_status(store, "sawyer-3", RobotStatus.OFFLINE, "test")
    alloc = RobotAllocation(
        store, "run-a", RobotRequest(2, TYPE, {"site": "lab"}), LearnerRequest(1)
    )
    other = RobotAllocation(store, "run-b", RobotRequest(1, TYPE), LearnerRequest(1))
    try:
        names = alloc.acquire(timeout_s=30)
        assert names == ["sawyer-1", "sawyer-2"]
        assert {lease.robot_id for lease in store.active_leases("run-a")} and len(
            store.active_leases("run-a")
        ) == 2
        # The learner's bundle is held: Ray's free CPUs dropped by its CPUs, and the learner
        # runs inside that group.
        wait_available_cpus(NODE_CPUS - 1, "learner bundle held")
        learner = LearnerProbe.options(scheduling_strategy=alloc.learner_strategy()).remote()
        assert ray.get(learner.group.remote(), timeout=60) == alloc.placement_group.id.hex()
        ray.kill(learner)
        # e-stopped (sawyer-0), leased (sawyer-1, sawyer-2) and offline (sawyer-3): none left.
        with pytest.raises(SchedulingError, match="needs 1 schedulable robot"):
            other.acquire(timeout_s=10)
        assert store.active_leases("run-b") == [] and other.placement_group is None
    finally:
        alloc.release()
    assert store.active_leases("run-a") == []
    assert alloc.placement_group is None
    wait_available_cpus(NODE_CPUS, "placement group not freed")


def test_robots_that_are_not_ray_nodes_are_leasable(store: MetadataStore) -> None:
    """Robot computers that only dial the cloud (no Ray node, no node_ip) lease like any."""
    for name in ("remote-1", "remote-2"):
        enroll(store, name, tags={"site": "far"})
        assert heartbeat(store, name) == RobotStatus.IDLE
    with store.session() as s:
        remote = [r for r in s.scalars(select(Robot)) if r.name.startswith("remote-")]
    assert remote and all("node_ip" not in r.tags and "node" not in r.tags for r in remote)
    alloc = RobotAllocation(
        store, "run-a", RobotRequest(2, TYPE, {"site": "far"}), LearnerRequest(1)
    )
    try:
        assert alloc.acquire(timeout_s=30) == ["remote-1", "remote-2"]
        assert len(store.active_leases("run-a")) == 2
        assert heartbeat(store, "remote-1") == RobotStatus.LEASED
        wait_available_cpus(NODE_CPUS - 1, "learner bundle held")
    finally:
        alloc.release()
    assert store.active_leases() == []
    wait_available_cpus(NODE_CPUS, "placement group not freed")


def test_a_learner_ray_cannot_place_leases_nothing(store: MetadataStore) -> None:
    alloc = RobotAllocation(store, "run-a", RobotRequest(2, TYPE), LearnerRequest(num_cpus=1000))
    with pytest.raises(SchedulingError, match="Ray could not place"):
        alloc.acquire(timeout_s=2)
    assert store.active_leases() == []
    assert alloc.members == {} and alloc.placement_group is None
    with store.session() as s:
        statuses = {r.name: r.status for r in s.scalars(select(Robot))}
    assert statuses == dict.fromkeys(ROBOTS, RobotStatus.IDLE)  # all free for the next run
    wait_available_cpus(NODE_CPUS, "the refused group was not removed")
    # ...and the robots go to the next run that Ray can place.
    fits = RobotAllocation(store, "run-b", RobotRequest(2, TYPE), LearnerRequest(1))
    try:
        assert fits.acquire(timeout_s=30) == ["sawyer-0", "sawyer-1"]
    finally:
        fits.release()


def test_not_enough_robots_leases_nothing(store: MetadataStore) -> None:
    for n in ROBOTS[:3]:
        set_status(store, n, RobotStatus.UNHEALTHY, "test")
    alloc = RobotAllocation(store, "run-a", RobotRequest(2, TYPE))
    with pytest.raises(SchedulingError, match="needs 2 schedulable robot"):
        alloc.acquire(timeout_s=10)
    assert store.active_leases() == []
    with pytest.raises(ValueError, match="min_count"):
        RobotRequest(2, TYPE, min_count=3)


def test_concurrent_runs_never_double_book(store: MetadataStore) -> None:
    """Two runs ask for 3 of the 4 robots at the same moment: one wins, one gets none."""
    stores = [MetadataStore(store.url), MetadataStore(store.url)]
    allocs = [
        RobotAllocation(st, run, RobotRequest(3, TYPE), LearnerRequest(0.5))
        for st, run in zip(stores, ("run-a", "run-b"), strict=True)
    ]
    outcome: dict[str, str] = {}
    barrier = threading.Barrier(2)

    def go(alloc: RobotAllocation) -> None:
        barrier.wait()
        try:
            alloc.acquire(timeout_s=30)
            outcome[alloc.run_id] = "won"
        except SchedulingError:
            outcome[alloc.run_id] = "lost"

    threads = [threading.Thread(target=go, args=(a,)) for a in allocs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    try:
        assert sorted(outcome.values()) == ["lost", "won"], outcome
        leased = [lease.robot_id for lease in store.active_leases()]
        assert len(leased) == 3 == len(set(leased))
        # the loser holds no learner bundle either
        assert [a.placement_group is None for a in allocs].count(True) == 1
    finally:
        for a in allocs:
            a.release()
        for st in stores:
            st.close()


def test_degraded_run_takes_its_robot_back(store: MetadataStore) -> None:
    alloc = RobotAllocation(store, "run-a", RobotRequest(2, TYPE), LearnerRequest(1))
    try:
        alloc.acquire(timeout_s=30)
        group = alloc.placement_group
        t0 = utcnow()
        heartbeat(store, "sawyer-0", now=t0)
        heartbeat(store, "sawyer-1", now=t0 - timedelta(seconds=60))
        assert mark_offline(store, 10.0, now=t0 + timedelta(seconds=1)) == ["sawyer-1"]
        set_status(store, "sawyer-2", RobotStatus.OFFLINE, "test: no spare robots")
        set_status(store, "sawyer-3", RobotStatus.OFFLINE, "test: no spare robots")
        r = alloc.reconcile()
        assert r.lost == ["sawyer-1"] and r.degraded and alloc.active == ["sawyer-0"]
        assert r.added == []  # the lost robot keeps its slot and lease; no idle robots anyway
        assert heartbeat(store, "sawyer-1") == RobotStatus.LEASED
        r = alloc.reconcile()
        assert r.returned == ["sawyer-1"] and not r.degraded
        # An e-stop mid-run is a loss too; a retired robot frees its slot for another.
        heartbeat(store, "sawyer-0", estopped=True)
        heartbeat(store, "sawyer-2")
        set_status(store, "sawyer-1", RobotStatus.RETIRED, "broken")
        r = alloc.reconcile(timeout_s=30)
        assert sorted(r.lost) == ["sawyer-0", "sawyer-1"] and r.added == ["sawyer-2"]
        assert alloc.active == ["sawyer-2"] and r.degraded
        # Following the fleet never touches the learner's placement.
        assert alloc.placement_group is group
        wait_available_cpus(NODE_CPUS - 1, "learner bundle held")
    finally:
        alloc.release()


def test_robot_enrolled_during_run_becomes_schedulable(store: MetadataStore) -> None:
    for n in ROBOTS[2:]:
        set_status(store, n, RobotStatus.OFFLINE, "not here yet")
    alloc = RobotAllocation(store, "run-a", RobotRequest(3, TYPE, min_count=2))
    try:
        assert alloc.acquire(timeout_s=30) == ["sawyer-0", "sawyer-1"]
        assert alloc.reconcile().degraded
        # A new robot computer enrolls over gRPC during the run (no Ray node, no probe).
        enroll(store, "late-1")
        assert alloc.reconcile().added == []  # enrolled, but never heard from: not yet
        assert heartbeat(store, "late-1") == RobotStatus.IDLE
        r = alloc.reconcile(timeout_s=30)
        assert r.added == ["late-1"] and not r.degraded
        assert heartbeat(store, "late-1") == RobotStatus.LEASED
        assert len(store.active_leases("run-a")) == 3
    finally:
        alloc.release()


def test_suspend_frees_placement_but_keeps_leases(store: MetadataStore) -> None:
    paused = RobotAllocation(store, "run-a", RobotRequest(2, TYPE), LearnerRequest(1))
    other = RobotAllocation(store, "run-b", RobotRequest(2, TYPE), LearnerRequest(1))
    try:
        held = paused.acquire(timeout_s=30)
        wait_available_cpus(NODE_CPUS - 1, "learner bundle held")
        leases = {lease.id for lease in store.active_leases("run-a")}
        paused.suspend()
        assert {lease.id for lease in store.active_leases("run-a")} == leases  # kept as they were
        assert paused.placement_group is None
        wait_available_cpus(NODE_CPUS, "placement group not freed")
        # the suspended run's robots stay leased: another run gets the other two only
        assert set(other.acquire(timeout_s=30)).isdisjoint(held)
        paused.suspend()  # idempotent
        assert len(store.active_leases("run-a")) == 2
    finally:
        paused.release()
        other.release()
    assert store.active_leases() == []
