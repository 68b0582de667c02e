"""Runs in the metadata store: the one place a run row is created and its state changes.

A run is created ``pending`` by :func:`record_run` (the run manager, ``robofleet run launch``
and the dashboard all go through it). Requests from any process are state changes
(:func:`request`): ``stop`` -> ``stopping``, ``pause`` -> ``paused``, ``resume`` ->
``resuming``; the cloud that drives the run acts on them. Every change is an event
``run.<state>`` with the previous state (:func:`set_state`).
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any

from foundation.store.base import utcnow
from foundation.store.models import Run, RunState

if TYPE_CHECKING:
    from foundation.runspec import RunSpec
    from foundation.store.metadata_store import MetadataStore

# States in which a cloud drives the run (or is about to).
ACTIVE_STATES = frozenset(
    {RunState.PENDING, RunState.RUNNING, RunState.DEGRADED, RunState.RESUMING}
)

# action -> (states it is allowed from, the state it requests)
REQUESTS: dict[str, tuple[frozenset[RunState], RunState]] = {
    "stop": (ACTIVE_STATES | {RunState.PAUSED}, RunState.STOPPING),
    "resume": (frozenset({RunState.PAUSED, RunState.STOPPED, RunState.CRASHED}), RunState.RESUMING),
    "pause": (ACTIVE_STATES, RunState.PAUSED),
}


class RunNotFound(LookupError):
    """No run has this id; its message says so: ``no run 'run-…'``."""

    def __init__(self, run_id: str) -> None:
        super().__init__(run_id)
        self.run_id = run_id

    def __str__(self) -> str:
        return f"no run {self.run_id!r}"


class RunStateError(RuntimeError):
    """The run's state does not allow this action (e.g. pausing a stopped run)."""


def new_run_id() -> str:
    """``run-<UTC date>-<time>-<6 hex digits>``: sorts by creation time, unique per second."""
    return f"run-{utcnow():%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


def record_run(store: MetadataStore, spec: RunSpec, runs_dir: Path, *, actor: str) -> str:
    """Record a ``pending`` run of ``spec`` (event ``run.launched``); returns its new id.

    Validation is the caller's: nothing here checks that the fleet can serve ``spec``.
    """
    run_id = new_run_id()
    with store.session() as s:
        s.add(
            Run(
                id=run_id,
                name=spec.name,
                algorithm=spec.algorithm,
                state=RunState.PENDING,
                spec=spec.model_dump(mode="json"),
                run_dir=str(runs_dir / run_id),
            )
        )
        s.flush()
        store.record_event(
            "run.launched",
            actor=actor,
            run_id=run_id,
            session=s,
            name=spec.name,
            algorithm=spec.algorithm,
        )
    return run_id


def request(store: MetadataStore, run_id: str, action: str, *, actor: str) -> RunState:
    """Record a ``stop`` / ``pause`` / ``resume`` request for the run's cloud to act on.

    Returns:
        The state the run is in now (see :data:`REQUESTS`).

    Raises:
        RunNotFound: unknown run.
        RunStateError: the run's state forbids ``action``; nothing changed.
        KeyError: ``action`` is not a request.
    """
    sources, target = REQUESTS[action]
    with store.session() as s:
        run = s.get(Run, run_id)
        if run is None:
            raise RunNotFound(run_id)
        if run.state not in sources:
            raise RunStateError(
                f"cannot {action} run {run_id} while it is {run.state.value} "
                f"(allowed from: {', '.join(sorted(x.value for x in sources))})"
            )
    set_state(store, run_id, target, f"{action} requested by {actor}", actor=actor)
    return target


def end_run(store: MetadataStore, run_id: str, state: RunState, reason: str, *, actor: str) -> None:
    """End a run no cloud is driving: release its robots' leases, then move it to ``state``
    (``stopped`` or ``crashed``) with ``reason``.

    Raises:
        RunNotFound: no run ``run_id``.
    """
    store.release_leases(run_id, actor=actor)
    set_state(store, run_id, state, reason, actor=actor)


def set_state(
    store: MetadataStore,
    run_id: str,
    state: RunState,
    reason: str = "",
    *,
    only_from: set[RunState] | frozenset[RunState] | None = None,
    actor: str = "system",
    **data: Any,
) -> bool:
    """Move the run to ``state`` and record ``run.<state>`` with the previous state.

    With ``only_from``, nothing happens (returns False) when the run is in another state:
    a request that arrived meanwhile (pause, stop) is not overwritten.

    Raises:
        RunNotFound: no run ``run_id``.
    """
    with store.session() as s:
        run = s.get(Run, run_id, with_for_update=True)
        if run is None:
            raise RunNotFound(run_id)
        if only_from is not None and run.state not in only_from:
            return False
        before = run.state
        run.state = state
        run.reason = reason
        run.updated_at = utcnow()
        store.record_event(
            f"run.{state.value}",
            actor=actor,
            run_id=run_id,
            session=s,
            before=before.value,
            after=state.value,
            reason=reason,
            **data,
        )
    return True
