"""The people a cloud plays for a simulated fleet (``help.simulated_operators``).

Each turn, every free simulated operator takes the run's next help request through the same
:func:`foundation.store.help_assignments.take_next` a real person's "take next" uses, takes
the robot over (the request's answer ``took_over``, by that operator) and tells the robot on
its Control stream (``help_answered``). The robot's on-call person (``edge_agent.on_call``)
drives until it hands back; its report that the request closed frees the operator
(``foundation.store.help_requests.record_reports``).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from foundation.store import help_requests as store_help
from foundation.store.help_assignments import OperatorsBusy, busy_operators, take_next
from foundation.store.metadata_store import MetadataStore

log = logging.getLogger(__name__)


class SimulatedOperators:
    """``count`` simulated people serving one run's help requests.

    Args:
        store: metadata store (the run's requests and assignments).
        server: comms' ``CloudServer`` (``push_control``).
        run_id: the run.
        count: the run's ``help.operators``.

    Raises:
        ValueError: ``count`` below 1.
    """

    def __init__(self, store: MetadataStore, server: Any, run_id: str, count: int) -> None:
        if count < 1:
            raise ValueError(f"a run's operators number at least 1, got {count}")
        self.store, self.server, self.run_id, self.count = store, server, run_id, count
        self.names = [f"simulated-operator-{i + 1}" for i in range(count)]

    def turn(self) -> list[dict[str, Any]]:
        """Assign waiting requests to the free operators; returns the requests assigned."""
        store_help.expire_overdue(self.store, self.run_id)
        busy = busy_operators(self.store, self.run_id)
        assigned: list[dict[str, Any]] = []
        for name in self.names:
            if name in busy:
                continue
            try:
                row = take_next(self.store, self.run_id, name, self.count)
            except OperatorsBusy:
                break
            if row is None:
                break
            row = store_help.answer(self.store, self.run_id, row["id"], "took_over", name)
            reason = json.dumps({"key": row["key"], "outcome": "took_over", "by": name})
            told = self.server.push_control(row["robot_id"], "help_answered", self.run_id, reason)
            if not told:  # its request expires on the robot, whose report frees the operator
                log.warning("robot %s missed operator %s's takeover", row["robot_id"], name)
            assigned.append(row)
        return assigned
