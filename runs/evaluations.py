"""Success measured in a cloud-side simulator (``evaluation.on: simulator``): snapshots of the
published policy, evaluated by the run's evaluator process (a Ray actor at low CPU priority,
:mod:`runs.evaluator`, on a simulated robot of the run's robots' driver kind) oldest first
(:mod:`runs.evalqueue`). Each result is a point of :class:`runs.eval_record.EvaluationRecorder`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from foundation.runspec import RunSpec
from runs.eval_record import EvalPoint, Stamp
from runs.evalqueue import EvalSnapshot, EvaluationQueue


class SimulatorEvaluations:
    """The evaluator of one run and its queue of policy snapshots (an evaluation source).

    Args:
        spec: the run spec (tasks, policy width, episodes per task).
        kind: driver kind of the simulated evaluation robot (``runs.evaluator.simulator_kind``).
        dims: (state, action) sizes of the run's features (``hal.compat.RunFeatures``).
        max_steps: evaluation episode limit (steps).
        nice / backlog: the ``orchestration`` settings' ``evaluator_nice`` and
            ``eval_backlog``.
    """

    def __init__(
        self,
        spec: RunSpec,
        kind: str,
        dims: tuple[int, int],
        max_steps: int,
        nice: int,
        backlog: int,
    ) -> None:
        from runs.evaluator import remote_evaluator

        self.evaluator: Any = remote_evaluator().remote(
            kind,
            list(spec.tasks),
            dims,
            spec.policy.hidden_sizes[0],
            spec.evaluation.episodes_per_task,
            max_steps,
            nice,
        )
        self.queue = EvaluationQueue(self.evaluator.evaluate.remote, backlog)
        self.episodes = spec.evaluation.episodes_per_task
        self._last_version = -1

    def offer(
        self, version: int, weights: bytes, stamp: Callable[[], Stamp], final: bool
    ) -> int | None:
        """Queue ``version`` stamped now. A version already queued is not queued again, except
        for the ``final`` evaluation; none before the first version. Returns the version of
        the oldest waiting snapshot when the backlog dropped it."""
        if version == 0 or (version == self._last_version and not final):
            return None
        s = stamp()
        snap = EvalSnapshot(version, weights, s.wall_s, s.robot_hours, s.env_steps, s.interventions)
        dropped = self.queue.add(snap)
        self._last_version = version
        return None if dropped is None else dropped.version

    def poll(self, wait: bool) -> EvalPoint | None:
        got = self.queue.poll(wait)
        if got is None:
            return None
        snap, success = got
        stamp = Stamp(snap.wall_s, snap.robot_hours, snap.env_steps, snap.interventions)
        episodes = self.episodes
        extra = {
            "episodes": {t: episodes for t in success},
            "source": "simulator",
            "scored_by": {"simulator": episodes * len(success)},
        }
        return EvalPoint(stamp, snap.version, success, extra, weights=snap.weights)

    def pending(self) -> int:
        return len(self.queue)

    def close(self) -> None:
        import ray

        ray.kill(self.evaluator)
