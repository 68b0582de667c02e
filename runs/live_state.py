"""A live run's state from its leases: ``running`` with every robot it asked for, ``degraded``
short of some, recorded in the metadata store and the run's live figures; and the robots kept
in step with the leases (a retired robot dropped, an added one assigned). The driver's loop
asks for it; what the state follows is here alone.
"""

from __future__ import annotations

from typing import Any

from foundation.store.metadata_store import MetadataStore
from foundation.store.models import RunState
from foundation.store.runs import set_state
from runs import leasing
from runs.assignments import RobotAssignments


def set_live_state(
    store: MetadataStore,
    run_id: str,
    allocation: Any,
    count: int,
    progress: dict[str, Any],
    reason: str = "",
    *,
    only_from: set[RunState],
) -> None:
    """Record ``running`` (``degraded``: fewer than ``count`` robots active) from a state of
    ``only_from``, with the leased robots, and put it in ``progress``.

    Args:
        store / run_id: the run.
        allocation: its ``hal.scheduler.RobotAllocation``.
        count: the robots its spec asks for.
        progress: the run's live figures (their ``state``).
        reason: why (recorded with the state).
        only_from: the states the run may be in to take it.
    """
    short = len(allocation.active) < count
    state = RunState.DEGRADED if short else RunState.RUNNING
    robots = sorted(allocation.members)
    set_state(store, run_id, state, reason, only_from=only_from, robots=robots)
    progress["state"] = state.value


def reconcile(
    store: MetadataStore,
    run_id: str,
    allocation: Any,
    agents: RobotAssignments,
    progress: dict[str, Any],
) -> None:
    """Reconcile the leases (``allocation.reconcile``): robots whose lease is gone are
    dropped, robots added are assigned, and a change between ``running`` and ``degraded`` is
    recorded (with the robots lost) and put in ``progress``."""
    result = allocation.reconcile(timeout_s=5.0)
    for name in set(agents.names) - set(allocation.members):
        agents.drop(name)  # retired: its lease is gone
    members = leasing.members(allocation)
    for name in result.added:
        agents.start(name, members[name], len(agents))
    state = RunState.DEGRADED if result.degraded else RunState.RUNNING
    if state.value != progress.get("state"):
        live = {RunState.RUNNING, RunState.DEGRADED}
        set_state(store, run_id, state, only_from=live, lost=result.lost)
        progress["state"] = state.value
