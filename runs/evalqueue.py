"""Policy snapshots waiting for evaluation, evaluated oldest first, one at a time.

A run snapshots its published policy every ``evaluation.every_seconds`` and stamps it with the
run's clock and counts *then*; the evaluator (a Ray actor at low CPU priority) works through the
queue. A loaded machine therefore delays the results but does not coarsen the success curve:
each evaluation row is the policy as it was at its stamp.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EvalSnapshot:
    """A published policy waiting for evaluation.

    ``weights`` is the version's safetensors file (bytes); ``wall_s`` the run's clock (s),
    ``robot_hours``, ``env_steps`` and ``interventions`` the run's totals when it was taken.
    """

    version: int
    weights: bytes
    wall_s: float
    robot_hours: float
    env_steps: int
    interventions: int


class EvaluationQueue:
    """FIFO of :class:`EvalSnapshot` with one evaluation in flight.

    Args:
        evaluate: ``weights -> Ray ObjectRef`` of ``{task: success rate}`` (e.g. the evaluator
            actor's ``evaluate.remote``).
        backlog: snapshots that may wait (the one in flight not counted); adding one more drops
            the oldest waiting one, which :meth:`add` returns.

    Raises:
        ValueError: ``backlog`` < 1.
    """

    def __init__(self, evaluate: Callable[[bytes], Any], backlog: int) -> None:
        if backlog < 1:
            raise ValueError(f"backlog must be >= 1, got {backlog}")
        self._evaluate = evaluate
        self.backlog = backlog
        self._waiting: deque[EvalSnapshot] = deque()
        self._in_flight: tuple[Any, EvalSnapshot] | None = None
        self.dropped = 0

    def __len__(self) -> int:
        """Snapshots not yet evaluated, the one in flight included."""
        return len(self._waiting) + (self._in_flight is not None)

    def add(self, snap: EvalSnapshot) -> EvalSnapshot | None:
        """Queue ``snap`` (starting it when the evaluator is idle); returns a dropped one."""
        self._waiting.append(snap)
        dropped = None
        if len(self._waiting) > self.backlog:
            dropped = self._waiting.popleft()
            self.dropped += 1
        self._start_next()
        return dropped

    def poll(self, wait: bool = False) -> tuple[EvalSnapshot, dict[str, float]] | None:
        """The evaluation in flight if it finished (waiting for it with ``wait``), with its
        result; the next snapshot is started. None when nothing finished.

        Raises:
            ray.exceptions.RayError: the evaluation failed (the evaluator died or raised).
        """
        import ray

        if self._in_flight is None:
            self._start_next()
            if self._in_flight is None:
                return None
        ref, snap = self._in_flight
        done, _ = ray.wait([ref], timeout=None if wait else 0)
        if not done:
            return None
        self._in_flight = None
        result: dict[str, float] = ray.get(ref)
        self._start_next()
        return snap, result

    def _start_next(self) -> None:
        if self._in_flight is None and self._waiting:
            snap = self._waiting.popleft()
            self._in_flight = (self._evaluate(snap.weights), snap)
