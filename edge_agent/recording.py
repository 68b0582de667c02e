"""Recording one episode: the rows of its steps, queued for upload one step late.

Each step's row is held until the next step is recorded, so that an episode that ends early
(a stop, a pause turned stop, a cloud e-stop) can still close its last row as ``truncated``
with its real final observation (``next.observation.*``). With ``episode_commit =
"episode_end"`` the rows of the whole episode are held and submitted only by :meth:`commit`
(so an operator's ``rerecord`` can discard them); with ``"stream"`` they go to the uplink as
they are queued.

A row holds, in this order: ``robot_id``, ``run_id``, ``task``, ``episode_index``,
``frame_index``, ``timestamp`` (s since the episode's first step), ``reward``, ``terminated``,
``truncated``, ``is_intervention``, ``policy_version``, ``action`` (what the robot really
executed, ``(A,) float32``), ``action.policy`` (the novice's proposal when it differs from
``action``, else None), ``action.operator`` (the operator's action when it intervened and it
differs from ``action``, else None), then the step's ``observation.*`` features.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edge_agent.core import Observation, OperatorInput
from edge_agent.uplink import UplinkWorker

Row = dict[str, Any]


class EpisodeRecorder:
    """The rows of one episode.

    Args:
        uplink: where rows go (its ``submit`` validates and spools them).
        hold_all: keep every row until :meth:`commit` (``episode_commit = "episode_end"``).
        ids: the fields every row of the episode starts with (``robot_id``, ``run_id``,
            ``task``, ``episode_index``).
    """

    def __init__(self, uplink: UplinkWorker, hold_all: bool, ids: Row) -> None:
        self.uplink = uplink
        self.hold_all = hold_all
        self.ids = ids
        self._held: list[Row] = []
        self._emit = self._held.append if hold_all else uplink.submit
        self._pending: Row | None = None

    def record(
        self,
        *,
        frame: int,
        timestamp: float,
        reward: float,
        terminated: bool,
        truncated: bool,
        is_intervention: bool,
        policy_version: int,
        observation: Observation,
        proposed: np.ndarray,
        executed: np.ndarray,
        op: OperatorInput,
    ) -> None:
        """Queue the previous step's row and hold this step's (see the module for fields)."""
        if self._pending is not None:
            self._emit(self._pending)
        operator_action = (
            op.action
            if op.is_intervention
            and op.action is not None
            and not np.array_equal(op.action, executed)
            else None
        )
        self._pending = {
            **self.ids,
            "frame_index": frame,
            "timestamp": timestamp,
            "reward": reward,
            "terminated": terminated,
            "truncated": truncated,
            "is_intervention": is_intervention,
            "policy_version": policy_version,
            "action": executed,
            "action.policy": None if np.array_equal(proposed, executed) else proposed,
            "action.operator": operator_action,
            **{k: v for k, v in observation.items() if k.startswith("observation.")},
        }

    def close(self, final_observation: Observation) -> None:
        """End the episode at the last recorded step: queue its row, ``truncated`` unless it
        terminated, with ``final_observation`` as its ``next.observation.*``. Does nothing
        when no step was recorded (or the episode is already closed)."""
        row = self._pending
        if row is None:
            return
        row["truncated"] = row["truncated"] or not row["terminated"]
        row.update(
            {f"next.{k}": v for k, v in final_observation.items() if k.startswith("observation.")}
        )
        self._emit(row)
        self._pending = None

    def commit(self) -> None:
        """Submit the rows held for the episode's end (none when streaming)."""
        for row in self._held:
            self.uplink.submit(row)
