"""A run's evaluations: snapshots of the published policy, evaluated by the run's evaluator
process (a Ray actor at low CPU priority, :mod:`runs.evaluator`) oldest
first (:mod:`runs.evalqueue`); each result is a row of ``evals.jsonl``,
``success_rate`` metrics per task and the run's live ``success`` figures.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from foundation.runspec import RunSpec
from foundation.store.metrics import insert_metrics
from foundation.store.store import MetadataStore
from runs.clock import RunClock
from runs.evalqueue import EvalSnapshot, EvaluationQueue


def record_point(
    store: MetadataStore,
    run_id: str,
    run_dir: Path,
    row: dict[str, Any],
    on_event: Callable[..., None],
    **event: Any,
) -> None:
    """Record one point of a run's success curve (``row``: ``policy_version``, ``success``
    per task, ``success_mean``, ...): a line of ``evals.jsonl``, ``success_rate`` metrics per
    task and a ``run.evaluated`` event (with ``event`` beside its fields)."""
    with open(run_dir / "evals.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    version = row["policy_version"]
    points = [
        {"name": "success_rate", "step": version, "value": v, "task": t}
        for t, v in row["success"].items()
    ]
    insert_metrics(store, run_id, points)
    on_event("run.evaluated", policy_version=version, success_mean=row["success_mean"], **event)


class RunEvaluations:
    """The evaluator of one run and its queue of policy snapshots.

    Args:
        store / run_id / run_dir: the run.
        spec: the run spec (tasks, policy width, episodes per task).
        dims: (state, action) sizes of the run's features (``hal.compat.RunFeatures``).
        max_steps: evaluation episode limit (steps).
        nice / backlog: the ``orchestration`` settings' ``evaluator_nice`` and
            ``eval_backlog``.
        on_event: records an event of the run (``kind, **data``).
    """

    def __init__(
        self,
        store: MetadataStore,
        run_id: str,
        run_dir: Path,
        spec: RunSpec,
        dims: tuple[int, int],
        max_steps: int,
        nice: int,
        backlog: int,
        on_event: Callable[..., None],
    ) -> None:
        from runs.evaluator import remote_evaluator

        self.store, self.run_id, self.run_dir = store, run_id, run_dir
        self.on_event = on_event
        self.evaluator: Any = remote_evaluator().remote(
            list(spec.tasks),
            dims,
            spec.policy.hidden_sizes[0],
            spec.evaluation.episodes_per_task,
            max_steps,
            nice,
        )
        self.queue = EvaluationQueue(self.evaluator.evaluate.remote, backlog)
        self.last_at = -1e9  # when the last snapshot was offered (time.monotonic())
        self._last_version = -1

    def snapshot(
        self,
        version: int,
        weights: bytes,
        clock: RunClock,
        counts: Callable[[], tuple[int, int]],
        final: bool = False,
    ) -> None:
        """Queue ``version`` (its safetensors ``weights``), stamped with the run's clock and
        ``counts()`` (env steps, interventions: read only when a snapshot is queued) now. A
        version already queued is not queued again, except for the ``final`` evaluation;
        none before the first version."""
        self.last_at = time.monotonic()
        if version == 0 or (version == self._last_version and not final):
            return
        steps, interventions = counts()
        snap = EvalSnapshot(
            version, weights, clock.elapsed(), clock.robot_hours, steps, interventions
        )
        dropped = self.queue.add(snap)
        self._last_version = version
        if dropped is not None:
            self.on_event(
                "run.evaluation_dropped", policy_version=dropped.version, backlog=len(self.queue)
            )

    def collect(self, wait: bool = False) -> dict[str, Any] | None:
        """Record a finished evaluation, if there is one (``wait``: the next one); returns the
        run's figures it changes (``success``, ``success_mean``, ``eval_version``)."""
        got = self.queue.poll(wait)
        if got is None:
            return None
        snap, success = got
        mean = float(np.mean(list(success.values())))
        row = {
            "wall_s": snap.wall_s,
            "robot_hours": snap.robot_hours,
            "env_steps": snap.env_steps,
            "interventions": snap.interventions,
            "policy_version": snap.version,
            "success": success,
            "success_mean": mean,
        }
        record_point(self.store, self.run_id, self.run_dir, row, self.on_event)
        return {"success": success, "success_mean": mean, "eval_version": snap.version}

    def drain(self) -> list[dict[str, Any]]:
        """Evaluate every queued snapshot (at the end of a run); their figures in order."""
        out = []
        while len(self.queue):
            got = self.collect(wait=True)
            if got is not None:
                out.append(got)
        return out

    def close(self) -> None:
        import ray

        ray.kill(self.evaluator)
