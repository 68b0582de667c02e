"""Leasing robots beside learner resources on a real (single-node) Ray."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import ray

from hal.fleet import RobotReport, heartbeat, mark_offline, report_robots, set_status
from hal.resources import node_resources
from hal.scheduler import LearnerRequest, RobotAllocation, RobotRequest, SchedulingError
from robofleet.store.models import RobotStatus, Run, utcnow
from robofleet.store.store import MetadataStore, upgrade

ROBOTS = [f"sawyer-{i}" for i in range(4)]
TYPE = "metaworld-sawyer"


@pytest.fixture(scope="module")
def ray_node() -> Iterator[str]:
    res = node_resources((n, TYPE) for n in ROBOTS)
    ray.init(num_cpus=4, resources=res, include_dashboard=False, log_to_driver=False)
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


@ray.remote(num_cpus=0.1)
class EdgeProbe:
    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()


def test_acquire_places_edge_agents_and_never_estopped(store: MetadataStore) -> None:
    set_status(store, "sawyer-0", RobotStatus.ESTOPPED, "test")
    alloc = RobotAllocation(
        store, "run-a", RobotRequest(2, TYPE, {"site": "lab"}), LearnerRequest(1)
    )
    try:
        names = alloc.acquire(timeout_s=30)
        assert names == ["sawyer-1", "sawyer-2"]
        assert {lease.robot_id for lease in store.active_leases("run-a")} and len(
            store.active_leases("run-a")
        ) == 2
        agent = EdgeProbe.options(scheduling_strategy=alloc.edge_strategy("sawyer-1")).remote()
        assert ray.get(agent.node.remote(), timeout=60) == ray.get_runtime_context().get_node_id()
        # The robot's unique resource is held by the run's bundle, so nobody else can take it.
        assert ray.available_resources().get("robot/sawyer-1", 0.0) == 0.0
        ray.kill(agent)
    finally:
        alloc.release()
    assert store.active_leases("run-a") == []
    deadline = time.monotonic() + 30  # Ray frees a removed group's bundles asynchronously
    while ray.available_resources().get("robot/sawyer-1") != 1.0:
        assert time.monotonic() < deadline, "placement group not freed"
        time.sleep(0.1)


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
        RobotAllocation(st, run, RobotRequest(3, TYPE), LearnerRequest(0.5), edge_cpus=0.1)
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
    finally:
        for a in allocs:
            a.release()
        for st in stores:
            st.close()


def test_degraded_run_takes_its_robot_back(store: MetadataStore) -> None:
    alloc = RobotAllocation(store, "run-a", RobotRequest(2, TYPE), edge_cpus=0.1)
    try:
        alloc.acquire(timeout_s=30)
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
        agent = EdgeProbe.options(scheduling_strategy=alloc.edge_strategy("sawyer-1")).remote()
        assert ray.get(agent.node.remote(), timeout=60)
        ray.kill(agent)
        # An e-stop mid-run is a loss too; a retired robot frees its slot for another.
        heartbeat(store, "sawyer-0", estopped=True)
        heartbeat(store, "sawyer-2")
        set_status(store, "sawyer-1", RobotStatus.RETIRED, "broken")
        r = alloc.reconcile(timeout_s=30)
        assert sorted(r.lost) == ["sawyer-0", "sawyer-1"] and r.added == ["sawyer-2"]
        assert alloc.active == ["sawyer-2"] and r.degraded
    finally:
        alloc.release()


def test_robot_enrolled_during_run_becomes_schedulable(store: MetadataStore, ray_node: str) -> None:
    for n in ROBOTS[2:]:
        set_status(store, n, RobotStatus.OFFLINE, "not here yet")
    alloc = RobotAllocation(store, "run-a", RobotRequest(3, TYPE, min_count=2), edge_cpus=0.1)
    try:
        assert alloc.acquire(timeout_s=30) == ["sawyer-0", "sawyer-1"]
        assert alloc.reconcile().degraded
        # A new robot is enrolled and reported by its node; Ray was started without it.
        tok = store.create_enrollment_token(timedelta(minutes=5))
        store.consume_enrollment_token(tok, robot_name="late-1", robot_type=TYPE, spec={})
        report_robots(
            store, [RobotReport("late-1", "metaworld", TYPE, {})], node="head", node_ip=ray_node
        )
        assert alloc.reconcile().added == []  # enrolled, but never heard from: not yet
        assert heartbeat(store, "late-1") == RobotStatus.IDLE
        r = alloc.reconcile(timeout_s=30)
        assert r.added == ["late-1"] and not r.degraded
        agent = EdgeProbe.options(scheduling_strategy=alloc.edge_strategy("late-1")).remote()
        assert ray.get(agent.node.remote(), timeout=60) == ray.get_runtime_context().get_node_id()
        ray.kill(agent)
    finally:
        alloc.release()


def test_suspend_frees_placement_but_keeps_leases(store: MetadataStore) -> None:
    paused = RobotAllocation(store, "run-a", RobotRequest(2, TYPE), LearnerRequest(1))
    other = RobotAllocation(store, "run-b", RobotRequest(2, TYPE), LearnerRequest(1))
    try:
        held = paused.acquire(timeout_s=30)
        leases = {lease.id for lease in store.active_leases("run-a")}
        paused.suspend()
        assert {lease.id for lease in store.active_leases("run-a")} == leases  # kept as they were
        deadline = time.monotonic() + 30  # Ray frees a removed group's bundles asynchronously
        while any(ray.available_resources().get(f"robot/{n}") != 1.0 for n in held):
            assert time.monotonic() < deadline, "placement group not freed"
            time.sleep(0.1)
        # the suspended run's robots stay leased: another run gets the other two only
        assert set(other.acquire(timeout_s=30)).isdisjoint(held)
        paused.suspend()  # idempotent
        assert len(store.active_leases("run-a")) == 2
    finally:
        paused.release()
        other.release()
    assert store.active_leases() == []
