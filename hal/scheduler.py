"""Lease robots beside the learner's Ray resources.

A run asks for robots (a type and/or tags, a count, a minimum to start with) and learner
resources. :class:`RobotAllocation`:

1. picks idle matching robots and leases them atomically (``MetadataStore.lease_robots``:
   all or none; a partial unique index refuses double booking, so on a conflict it retries with
   the robots still free);
2. reserves the learner's CPUs/GPUs as a Ray placement group; when Ray cannot place it in
   time the leases are given back, so a run gets everything it asks for or nothing. Robots
   are not Ray resources: a robot computer dials the cloud over gRPC (outbound only, so one
   behind NAT needs none of Ray's ports) and is assigned to the run over its Control stream;
3. :meth:`RobotAllocation.reconcile`, called periodically by the run manager, follows the
   fleet: members that go offline/e-stopped/unhealthy are *lost* (the run continues degraded,
   keeping the lease), lost members that come back are *returned*, and while the run has fewer
   members than requested, newly idle matching robots (e.g. enrolled during the run) are
   leased, without restarting anything.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from foundation.store.metadata_store import LeaseConflict, MetadataStore
from foundation.store.models import Robot, RobotStatus


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
    """A robot held by the run: its lease and whether it is usable now."""

    robot_id: int
    name: str
    robot_type: str
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
    """The robots and the learner's Ray placement of one run. Needs ``ray.init`` done by
    the caller.

    Args:
        store: metadata store.
        run_id: an existing ``Run``.
        request / learner: what the run needs.
    """

    def __init__(
        self,
        store: MetadataStore,
        run_id: str,
        request: RobotRequest,
        learner: LearnerRequest | None = None,
        *,
        actor: str = "scheduler",
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.request = request
        self.learner = learner or LearnerRequest()
        self.actor = actor
        self.members: dict[str, Member] = {}
        self.placement_group: Any = None

    # -- acquire -----------------------------------------------------------------------------

    def acquire(self, *, timeout_s: float = 60.0, retries: int = 5) -> list[str]:
        """Lease robots and reserve the learner's placement group; returns the robot names.

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
            self.placement_group = self._create_group([self.learner.bundle()], timeout_s)
        except BaseException:
            self.store.release_leases(self.run_id, [r.id for r in robots], actor=self.actor)
            raise
        for r in robots:
            self.members[r.name] = Member(r.id, r.name, r.robot_type)
        self.store.record_event(
            "run.placed", actor=self.actor, run_id=self.run_id, robots=[r.name for r in robots]
        )
        return [r.name for r in robots]

    # -- placement ---------------------------------------------------------------------------

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
                if self._add(robot):
                    result.added.append(robot.name)
        result.degraded = len(self.active) < self.request.count
        return result

    def _add(self, robot: Robot) -> bool:
        try:
            self.store.lease_robots(self.run_id, [robot.id], actor=self.actor)
        except LeaseConflict:
            return False  # another run took it first
        self.members[robot.name] = Member(robot.id, robot.name, robot.robot_type)
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

        if self.placement_group is not None:
            remove_placement_group(self.placement_group)
        self.placement_group = None
        self.members.clear()

    # -- internals ---------------------------------------------------------------------------

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
