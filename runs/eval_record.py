"""A run's success curve: the one recorder both evaluation sources feed.

A source measures success: :class:`runs.evaluations.SimulatorEvaluations` (snapshots of the
published policy evaluated in a cloud-side simulator, ``evaluation.on: simulator``) or
:class:`runs.robot_evals.RobotEvaluations` (the robots' own policy-only episodes,
``evaluation.on: robots``). :class:`EvaluationRecorder` owns what a point becomes: a row of
``evals.jsonl``, ``success_rate`` metrics per task, a ``run.evaluated`` event, the best
evaluated version kept for promotion (:mod:`runs.promotion`) and the run's live figures
(``success``, ``success_mean``, ``eval_version``, ``autonomous_success``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from foundation.store.metadata_store import MetadataStore
from foundation.store.metrics import insert_metrics
from runs.clock import RunClock
from runs.progress import append_record
from runs.promotion import BestEvaluated

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Stamp:
    """The run's clock and totals when a point's policy was taken: ``wall_s`` (s),
    ``robot_hours``, ``env_steps``, ``interventions``."""

    wall_s: float
    robot_hours: float
    env_steps: int
    interventions: int


@dataclass(frozen=True)
class EvalPoint:
    """One measured point: ``success`` (task -> rate 0..1) of ``policy_version`` at ``stamp``;
    ``extra`` goes into its ``evals.jsonl`` row beside the common fields (``source`` and
    ``scored_by`` there are also named in the event; an ``autonomous`` dict becomes
    ``autonomous_success``); ``weights``: that version's safetensors bytes (what the run
    promotes if the point ranks best, ``runs.promotion``; None: unknown)."""

    stamp: Stamp
    policy_version: int
    success: Mapping[str, float]
    extra: Mapping[str, Any] = field(default_factory=dict)
    weights: bytes | None = field(default=None, repr=False)


class EvaluationSource(Protocol):
    """What measures a run's success; :class:`EvaluationRecorder` records what it yields."""

    def offer(
        self, version: int, weights: bytes, stamp: Callable[[], Stamp], final: bool
    ) -> int | None:
        """Take the published ``version`` (its safetensors ``weights``) now; ``stamp()`` reads
        the run's clock and totals. Returns the version of a snapshot dropped unevaluated."""
        ...

    def poll(self, wait: bool) -> EvalPoint | None:
        """The next finished point, if there is one (``wait``: block for it)."""
        ...

    def pending(self) -> int:
        """Points still to come from what was offered."""
        ...

    def close(self) -> None: ...


class NoEvaluations:
    """The source of a run that measures no success (``evaluation.on: none``): no points."""

    def offer(
        self, version: int, weights: bytes, stamp: Callable[[], Stamp], final: bool
    ) -> int | None:
        return None

    def poll(self, wait: bool) -> EvalPoint | None:
        return None

    def pending(self) -> int:
        return 0

    def close(self) -> None:
        pass


class EvaluationRecorder:
    """Records the points of one run's evaluation source.

    Args:
        store / run_id / run_dir: the run.
        source: what measures success.
        on_event: records an event of the run (``kind, **data``).
    """

    def __init__(
        self,
        store: MetadataStore,
        run_id: str,
        run_dir: Path,
        source: EvaluationSource,
        on_event: Callable[..., None],
    ) -> None:
        self.store, self.run_id, self.run_dir = store, run_id, run_dir
        self.source = source
        self.on_event = on_event
        self.best = BestEvaluated(run_dir)  # the version the run promotes when it ends
        self.last_at = -1e9  # when the last snapshot was offered (time.monotonic())

    def snapshot(
        self,
        version: int,
        weights: bytes,
        clock: RunClock,
        counts: Callable[[], tuple[int, int]],
        final: bool = False,
    ) -> None:
        """Offer the published ``version`` to the source, stamped with the run's ``clock`` and
        ``counts()`` (env steps, interventions: read only when the source takes a stamp)."""
        self.last_at = time.monotonic()

        def stamp() -> Stamp:
            steps, interventions = counts()
            return Stamp(clock.elapsed(), clock.robot_hours, steps, interventions)

        dropped = self.source.offer(version, weights, stamp, final)
        if dropped is not None:
            self.on_event(
                "run.evaluation_dropped", policy_version=dropped, backlog=self.source.pending()
            )

    def collect(self, wait: bool = False) -> dict[str, Any] | None:
        """Record the next finished point, if there is one (``wait``: the next one); returns
        the run's figures it changes."""
        point = self.source.poll(wait)
        if point is None:
            return None
        success = dict(point.success)
        mean = sum(success.values()) / len(success)
        s = point.stamp
        row = {
            "wall_s": s.wall_s,
            "robot_hours": s.robot_hours,
            "env_steps": s.env_steps,
            "interventions": s.interventions,
            "policy_version": point.policy_version,
            "success": success,
            "success_mean": mean,
            **point.extra,
        }
        if not append_record(self.run_dir / "evals.jsonl", row):  # the disk is full
            log.warning("run %s: disk full; evaluation point not in evals.jsonl", self.run_id)
        metrics = [
            {"name": "success_rate", "step": point.policy_version, "value": v, "task": t}
            for t, v in success.items()
        ]
        insert_metrics(self.store, self.run_id, metrics)
        self.best.consider(row, point.weights)
        source = {k: row[k] for k in ("source", "scored_by") if k in row}
        self.on_event(
            "run.evaluated", policy_version=point.policy_version, success_mean=mean, **source
        )
        figures = {"success": success, "success_mean": mean, "eval_version": point.policy_version}
        if "autonomous" in row:
            figures["autonomous_success"] = row["autonomous"]
        return figures

    def drain(self) -> list[dict[str, Any]]:
        """Record every point still to come (at the end of a run); their figures in order."""
        out = []
        while self.source.pending():
            got = self.collect(wait=True)
            if got is not None:
                out.append(got)
        return out

    def close(self) -> None:
        self.source.close()
