"""Lease robots beside learner resources and pin edge agents to their robots' nodes.

A run asks for robots (a type and/or tags, a count, a minimum to start with) and learner
resources. :class:`RobotAllocation`:

1. picks idle matching robots and leases them atomically (``MetadataStore.lease_robots``:
   all or none; a partial unique index refuses double booking, so on a conflict it retries with
   the robots still free);
2. creates one Ray placement group: bundle 0 is the learner (CPU/GPU), bundle i>0 holds
   ``robot/<name>`` (exists only on that robot's node) plus the edge agent's CPUs; robots
   without a Ray resource yet (enrolled after their node started) are pinned by the node's
   ``node:<ip>`` resource instead;
3. :meth:`RobotAllocation.reconcile`, called periodically by the run manager, follows the
   fleet: members that go offline/e-stopped/unhealthy are *lost* (the run continues degraded,
   keeping the lease and bundle), lost members that come back are *returned*, and while the run
   has fewer members than requested, newly idle matching robots (e.g. enrolled during the run)
   are leased and placed in their own one-bundle placement group, without restarting anything.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from hal.resources import robot_resource, type_resource
from robofleet.store.models import Robot, RobotStatus
from robofleet.store.store import LeaseConflict, MetadataStore

# Ray's automatic per-node resource has capacity 1; a tiny share pins without excluding others.
_NODE_SHARE = 0.001


class SchedulingError(RuntimeError):
    """Not enough schedulable robots, or Ray could not place the run in time (nothing held)."""


@dataclass(frozen=True)
class RobotRequest:
    """Robots a run needs: ``count`` robots of ``robot_type`` (None: any) whose tags contain
    ``tags``; the run may start with ``min_count`` (default ``count``) and grows later."""

    count: int
    robot_type: str | None = None
    tags: dict[str, Any] = field(default_factory=dict)
    min_count: int | None = None

    def __post_init__(self) -> None:
        if self.count <= 0:
            raise ValueError(f"count must be positive, got {self.count}")
        if self.min_count is not None and not 0 < self.min_count <= self.count:
            raise ValueError(f"min_count must be in 1..{self.count}, got {self.min_count}")

    def matches(self, robot: Robot) -> bool:
        if self.robot_type is not None and robot.robot_type != self.robot_type:
            return False
        return all(robot.tags.get(k) == v for k, v in self.tags.items())


@dataclass(frozen=True)
class LearnerRequest:
    """Resources of the learner bundle (GPUs, CPUs)."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0

    def bundle(self) -> dict[str, float]:
        b = {"CPU": self.num_cpus}
        if self.num_gpus:
            b["GPU"] = self.num_gpus
        return b


@dataclass
class Member:
    """A robot held by the run: its lease, where it is placed, and whether it is usable now."""

    robot_id: int
    name: str
    robot_type: str
    placement_group: Any
    bundle_index: int
    active: bool = True


@dataclass
class ReconcileResult:
    lost: list[str] = field(default_factory=list)
    returned: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    degraded: bool = False


def schedulable_robots(
    store: MetadataStore, request: RobotRequest, exclude: set[int]
) -> list[Robot]:
    """Idle robots matching ``request`` (never e-stopped, unhealthy, offline, leased), by name."""
    with store.session() as s:
        q = select(Robot).where(Robot.status == RobotStatus.IDLE).order_by(Robot.name)
        if request.robot_type is not None:
            q = q.where(Robot.robot_type == request.robot_type)
        return [r for r in s.scalars(q) if r.id not in exclude and request.matches(r)]


class RobotAllocation:
    """The robots and Ray placement of one run. Needs ``ray.init`` done by the caller.

    Args:
        store: metadata store.
        run_id: an existing ``Run``.
        request / learner: what the run needs.
        edge_cpus: CPUs reserved next to each robot for its edge agent.
    """

    def __init__(
        self,
        store: MetadataStore,
        run_id: str,
        request: RobotRequest,
        learner: LearnerRequest | None = None,
        *,
        edge_cpus: float = 0.5,
        actor: str = "scheduler",
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.request = request
        self.learner = learner or LearnerRequest()
        self.edge_cpus = edge_cpus
        self.actor = actor
        self.members: dict[str, Member] = {}
        self.placement_group: Any = None
        self._extra_groups: list[Any] = []

    # -- acquire -----------------------------------------------------------------------------

    def acquire(self, *, timeout_s: float = 60.0, retries: int = 5) -> list[str]:
        """Lease robots and reserve the placement group; returns the robot names.

        Raises:
            SchedulingError: fewer than ``min_count`` schedulable robots, or the placement group
                was not ready within ``timeout_s`` (leases released, group removed).
        """
        want_min = self.request.min_count or self.request.count
        robots: list[Robot] = []
        for _ in range(retries):
            free = schedulable_robots(self.store, self.request, exclude=set())
            if len(free) < want_min:
                raise SchedulingError(
                    f"run {self.run_id}: needs {want_min} schedulable robot(s) matching "
                    f"{self._describe()}, {len(free)} available"
                )
            robots = free[: self.request.count]
            try:
                self.store.lease_robots(self.run_id, [r.id for r in robots], actor=self.actor)
                break
            except LeaseConflict:
                continue  # another run won some of them; look again
        else:
            raise SchedulingError(f"run {self.run_id}: lost the lease race {retries} times")
        try:
            bundles = [self.learner.bundle()] + [self._bundle(r) for r in robots]
            self.placement_group = self._create_group(bundles, timeout_s)
        except BaseException:
            self.store.release_leases(self.run_id, [r.id for r in robots], actor=self.actor)
            raise
        for i, r in enumerate(robots, start=1):
            self.members[r.name] = Member(r.id, r.name, r.robot_type, self.placement_group, i)
        self.store.record_event(
            "run.placed", actor=self.actor, run_id=self.run_id, robots=[r.name for r in robots]
        )
        return [r.name for r in robots]

    # -- placement ---------------------------------------------------------------------------

    def edge_strategy(self, robot_name: str) -> Any:
        """Ray scheduling strategy that runs an actor on ``robot_name``'s node, in its bundle.

        Raises:
            KeyError: the robot is not a member of this run.
        """
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        m = self.members[robot_name]
        return PlacementGroupSchedulingStrategy(
            placement_group=m.placement_group, placement_group_bundle_index=m.bundle_index
        )

    def learner_strategy(self) -> Any:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(
            placement_group=self.placement_group, placement_group_bundle_index=0
        )

    @property
    def active(self) -> list[str]:
        return sorted(n for n, m in self.members.items() if m.active)

    # -- follow the fleet --------------------------------------------------------------------

    def reconcile(self, *, timeout_s: float = 60.0) -> ReconcileResult:
        """Mark lost and returned members and grow toward ``count`` (module doc, step 3)."""
        result = ReconcileResult()
        with self.store.session() as s:
            rows = {
                r.name: r
                for r in s.scalars(select(Robot).where(Robot.name.in_(list(self.members))))
            }
        for name, m in list(self.members.items()):
            robot = rows.get(name)
            status = robot.status if robot is not None else RobotStatus.RETIRED
            if status == RobotStatus.RETIRED:
                self.store.release_leases(self.run_id, [m.robot_id], actor=self.actor)
                del self.members[name]
                result.lost.append(name)
            elif status == RobotStatus.LEASED and not m.active:
                m.active = True
                result.returned.append(name)
            elif status != RobotStatus.LEASED and m.active:
                m.active = False
                result.lost.append(name)
        for name in result.lost:
            self.store.record_event(
                "run.robot_lost", actor=self.actor, run_id=self.run_id, robot=name
            )
        for name in result.returned:
            self.store.record_event(
                "run.robot_returned", actor=self.actor, run_id=self.run_id, robot=name
            )
        missing = self.request.count - len(self.members)
        if missing > 0:
            taken = {m.robot_id for m in self.members.values()}
            for robot in schedulable_robots(self.store, self.request, taken)[:missing]:
                if self._add(robot, timeout_s):
                    result.added.append(robot.name)
        result.degraded = len(self.active) < self.request.count
        return result

    def _add(self, robot: Robot, timeout_s: float) -> bool:
        try:
            self.store.lease_robots(self.run_id, [robot.id], actor=self.actor)
        except LeaseConflict:
            return False  # another run took it first
        try:
            group = self._create_group([self._bundle(robot)], timeout_s)
        except SchedulingError:
            self.store.release_leases(self.run_id, [robot.id], actor=self.actor)
            return False
        self._extra_groups.append(group)
        self.members[robot.name] = Member(robot.id, robot.name, robot.robot_type, group, 0)
        self.store.record_event(
            "run.robot_added", actor=self.actor, run_id=self.run_id, robot=robot.name
        )
        return True

    def release(self) -> None:
        """Release every lease and placement group of the run (idempotent)."""
        self.store.release_leases(self.run_id, actor=self.actor)
        self._remove_groups()

    def suspend(self) -> None:
        """Free the run's Ray placement but KEEP its leases (idempotent).

        For a paused run whose cloud process goes away: its robots stay leased to it (no
        other run can take them) while no Ray resource is held; :meth:`release` (or the run
        manager, when the run resumes) gives the leases back.
        """
        self._remove_groups()
        self.store.record_event("run.placement_suspended", actor=self.actor, run_id=self.run_id)

    def _remove_groups(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for group in [self.placement_group, *self._extra_groups]:
            if group is not None:
                remove_placement_group(group)
        self.placement_group = None
        self._extra_groups.clear()
        self.members.clear()

    # -- internals ---------------------------------------------------------------------------

    def _bundle(self, robot: Robot) -> dict[str, float]:
        import ray

        bundle: dict[str, float] = {"CPU": self.edge_cpus} if self.edge_cpus else {}
        cluster = ray.cluster_resources()
        if robot_resource(robot.name) in cluster:
            bundle[robot_resource(robot.name)] = 1.0
            if type_resource(robot.robot_type) in cluster:
                bundle[type_resource(robot.robot_type)] = 1.0
            return bundle
        node_ip = robot.tags.get("node_ip")
        if node_ip and f"node:{node_ip}" in cluster:
            bundle[f"node:{node_ip}"] = _NODE_SHARE
            return bundle
        raise SchedulingError(
            f"robot {robot.name}: no Ray node offers {robot_resource(robot.name)} and its "
            f"node_ip {node_ip!r} is not in the cluster"
        )

    def _create_group(self, bundles: list[dict[str, float]], timeout_s: float) -> Any:
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group

        group = placement_group(bundles, strategy="PACK", name="")
        deadline = time.monotonic() + timeout_s
        ready = group.ready()
        try:
            ray.get(ready, timeout=max(0.1, deadline - time.monotonic()))
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(group)
            raise SchedulingError(
                f"run {self.run_id}: Ray could not place {bundles} within {timeout_s}s"
            ) from None
        return group

    def _describe(self) -> str:
        parts = [f"type={self.request.robot_type}"] if self.request.robot_type else []
        parts += [f"{k}={v}" for k, v in self.request.tags.items()]
        return ", ".join(parts) or "any"
