"""The seam between the dashboard and run orchestration.

The dashboard asks a :class:`RunManager` to launch, stop, pause, resume and checkpoint runs.
The real one (issue 8) starts learners and leases robots; until it exists,
:class:`StoreRunManager` records each request in the metadata store (the run row, its state,
an audit event) and nothing executes. Any implementation must leave nothing half-created when
it raises.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Protocol, runtime_checkable

from sqlalchemy import select
from sqlalchemy.orm import Session

from robofleet.runspec import RunSpec
from robofleet.store.models import Lease, Robot, RobotStatus, Run, RunState, utcnow
from robofleet.store.store import MetadataStore


class RunNotFound(LookupError):
    """No run has this id."""


class RunStateError(RuntimeError):
    """The run's state does not allow this action (e.g. pausing a stopped run)."""


@runtime_checkable
class RunManager(Protocol):
    """What the dashboard needs from run orchestration. ``actor`` goes into audit events.

    Every method raises :class:`RunNotFound` for an unknown id and :class:`RunStateError` when
    the run's current state forbids the action; on error nothing has changed.
    """

    def launch(self, spec: RunSpec, *, actor: str) -> str:
        """Create and start a run from ``spec``; returns the new run id.

        Raises:
            robofleet.runspec.RunSpecError: the spec is valid on its own but this manager
                cannot run it (unknown task, knob or too few robots), by dotted field path.
        """
        ...

    def stop(self, run_id: str, *, actor: str) -> None:
        """Stop the run and release its robots; it can be resumed from its last checkpoint."""
        ...

    def pause(self, run_id: str, *, actor: str) -> None:
        """Hold the robots' control loops without releasing leases (spools drain; the
        learner may go on training); ``resume`` continues on the same robots."""
        ...

    def resume(self, run_id: str, *, actor: str) -> None:
        """Continue a paused, stopped or crashed run from its last checkpoint."""
        ...

    def checkpoint_now(self, run_id: str, *, actor: str) -> None:
        """Ask the learner to write a checkpoint at its next update boundary."""
        ...


# (allowed source states, target state) per action for the store-only manager.
_ACTIVE = {RunState.PENDING, RunState.RUNNING, RunState.DEGRADED, RunState.RESUMING}
TRANSITIONS: dict[str, tuple[frozenset[RunState], RunState | None]] = {
    "stop": (frozenset(_ACTIVE | {RunState.PAUSED}), RunState.STOPPED),
    "pause": (frozenset(_ACTIVE), RunState.PAUSED),
    "resume": (
        frozenset({RunState.PAUSED, RunState.STOPPED, RunState.CRASHED}),
        RunState.RESUMING,
    ),
    "checkpoint_now": (frozenset(_ACTIVE | {RunState.PAUSED}), None),
}


EVENT_KINDS = {
    "stop": "run.stopped",
    "pause": "run.paused",
    "resume": "run.resume_requested",
    "checkpoint_now": "run.checkpoint_requested",
}


def new_run_id() -> str:
    return f"run-{utcnow():%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


class StoreRunManager:
    """Records runs and state changes in the metadata store; starts no process.

    ``launch`` stores the run as ``pending``; ``stop`` marks it ``stopped`` and releases its
    leases; ``pause`` marks it ``paused``; ``resume`` marks it ``resuming`` (waiting for the run
    manager to pick it up); ``checkpoint_now`` records the request as an event.
    """

    def __init__(self, store: MetadataStore, runs_dir: Path) -> None:
        self.store = store
        self.runs_dir = runs_dir

    def launch(self, spec: RunSpec, *, actor: str) -> str:
        run_id = new_run_id()
        with self.store.session() as s:
            s.add(
                Run(
                    id=run_id,
                    name=spec.name,
                    algorithm=spec.algorithm,
                    state=RunState.PENDING,
                    spec=spec.model_dump(mode="json"),
                    run_dir=str(self.runs_dir / run_id),
                )
            )
            s.flush()
            self.store.record_event(
                "run.launched", actor=actor, run_id=run_id, session=s, algorithm=spec.algorithm
            )
        return run_id

    def _transition(self, action: str, run_id: str, actor: str) -> None:
        allowed, target = TRANSITIONS[action]
        with self.store.session() as s:
            run = s.get(Run, run_id, with_for_update=True)
            if run is None:
                raise RunNotFound(run_id)
            if run.state not in allowed:
                raise RunStateError(
                    f"cannot {action.replace('_', ' ')} run {run_id} while it is {run.state.value}"
                    f" (allowed from: {', '.join(sorted(x.value for x in allowed))})"
                )
            before = run.state
            if target is not None:
                run.state = target
                run.updated_at = utcnow()
            if target == RunState.STOPPED:
                self._release(s, run_id, actor)
            self.store.record_event(
                EVENT_KINDS[action],
                actor=actor,
                run_id=run_id,
                session=s,
                before=before.value,
                after=(target or before).value,
            )

    def _release(self, s: Session, run_id: str, actor: str) -> None:
        # Inside the state change's transaction, so a failed stop keeps its leases.
        now = utcnow()
        for lease in s.scalars(
            select(Lease).where(Lease.run_id == run_id, Lease.released_at.is_(None))
        ):
            lease.released_at = now
            robot = s.get(Robot, lease.robot_id)
            if robot is not None and robot.status == RobotStatus.LEASED:
                robot.status = RobotStatus.IDLE
            self.store.record_event(
                "lease.released", actor=actor, run_id=run_id, robot_id=lease.robot_id, session=s
            )

    def stop(self, run_id: str, *, actor: str) -> None:
        self._transition("stop", run_id, actor)

    def pause(self, run_id: str, *, actor: str) -> None:
        self._transition("pause", run_id, actor)

    def resume(self, run_id: str, *, actor: str) -> None:
        self._transition("resume", run_id, actor)

    def checkpoint_now(self, run_id: str, *, actor: str) -> None:
        self._transition("checkpoint_now", run_id, actor)
