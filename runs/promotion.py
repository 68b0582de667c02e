"""Which version a run promotes when it ends: the one its evaluations speak best for.

The rule: each point of the run's success curve (a row of ``evals.jsonl``) is one measurement
of one policy version: its mean success over the run's tasks, ``p``, from ``n`` evaluation
episodes (all tasks), scored by the sources in its ``scored_by``. A point is ranked by the
lower end of the 95% Wilson score interval of ``p`` over ``n`` episodes (Wilson 1927), so a
rate from few episodes counts for less than the same rate from many (1 success of 1: 0.21;
8 of 10: 0.49). The highest wins; on a tie the later point (the newer version). Points are
judged alone, not pooled per version. A point without an episode count ranks as ``n = 0``
(bound 0).

:class:`BestEvaluated` keeps the leader's weights beside the run (``best_evaluated.*``, written
as each point is recorded: the run's ``weights/`` keeps only its last few versions), so the
version promoted at the end is the one evaluated, whatever the learner published since. With
no point at all (``evaluation.on: none``, or the run ended before every task had an
evaluation episode) nothing is promoted and the report says why; ``robofleet run promote RUN
--version N`` promotes any version still on disk by hand.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from foundation.durable import atomic_write_bytes, atomic_write_text
from foundation.runspec import RunSpec
from foundation.store.metadata_store import MetadataStore

Z95 = 1.959964  # the two-sided 95% normal quantile
BEST_WEIGHTS = "best_evaluated.safetensors"
BEST_INFO = "best_evaluated.json"
RULE = "highest 95% Wilson lower bound of an evaluation point's success; latest on ties"


def wilson_lower(p: float, n: int, z: float = Z95) -> float:
    """Lower end of the Wilson score interval of a success rate ``p`` (0..1) observed over
    ``n`` trials (0 for ``n`` 0).

    Raises:
        ValueError: ``p`` is not a rate between 0 and 1.
    """
    if not 0.0 <= p <= 1.0 + 1e-9:
        raise ValueError(f"a success rate must lie in [0, 1], got {p!r} over {n} trials")
    p = min(p, 1.0)  # a mean of rates may round a hair above 1
    if n <= 0:
        return 0.0
    denom = 1 + z * z / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, (centre - spread) / denom)


@dataclass(frozen=True)
class Evidence:
    """One evaluation point as promotion evidence: ``policy_version``, ``success`` (mean over
    tasks, 0..1), ``episodes`` (evaluation episodes, all tasks), ``scored_by`` (source ->
    episodes), ``lower_bound`` (:func:`wilson_lower`) and ``wall_s`` (run clock, s)."""

    policy_version: int
    success: float
    episodes: int
    lower_bound: float
    wall_s: float
    scored_by: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> Evidence:
        """The evidence of an ``evals.jsonl`` row.

        Raises:
            KeyError: the row lacks ``policy_version`` or ``success_mean``.
        """
        episodes = sum(int(v) for v in dict(row.get("episodes") or {}).values())
        success = float(row["success_mean"])
        return cls(
            policy_version=int(row["policy_version"]),
            success=success,
            episodes=episodes,
            lower_bound=round(wilson_lower(success, episodes), 6),
            wall_s=float(row.get("wall_s", 0.0)),
            scored_by={str(k): int(v) for k, v in dict(row.get("scored_by") or {}).items()},
        )

    def beats(self, other: Evidence | None) -> bool:
        """Ranks at least as high as ``other`` (a later point wins a tie)."""
        return other is None or self.lower_bound >= other.lower_bound


def choose(rows: list[Mapping[str, Any]]) -> Evidence | None:
    """The point :data:`RULE` picks from ``rows`` in the order recorded (None: no rows)."""
    best: Evidence | None = None
    for row in rows:
        e = Evidence.of(row)
        if e.beats(best):
            best = e
    return best


class BestEvaluated:
    """The run's best evaluated version so far and its weights, on disk in ``run_dir``
    (read back when a run resumes)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.best: Evidence | None = None
        try:
            info = json.loads((run_dir / BEST_INFO).read_text())
            if (run_dir / BEST_WEIGHTS).is_file():
                self.best = Evidence(**info["evidence"])
        except (FileNotFoundError, KeyError, TypeError, ValueError):
            self.best = None

    def consider(self, row: Mapping[str, Any], weights: bytes | None) -> bool:
        """Keep the point's version if it ranks best (its ``weights``: the safetensors bytes of
        that version; None: unknown, the point cannot lead). Returns whether it leads now."""
        e = Evidence.of(row)
        if weights is None or not e.beats(self.best):
            return False
        atomic_write_bytes(self.run_dir / BEST_WEIGHTS, bytes(weights))
        atomic_write_text(self.run_dir / BEST_INFO, json.dumps({"evidence": asdict(e)}))
        self.best = e
        return True

    def weights(self) -> bytes:
        """The best version's weights.

        Raises:
            FileNotFoundError: none kept yet.
        """
        return (self.run_dir / BEST_WEIGHTS).read_bytes()


def based_on(evidence: Evidence) -> dict[str, Any]:
    """What ``promoted.json`` and the report say a promotion on evidence was based on."""
    return {"by": "evaluation", "rule": RULE, "evidence": asdict(evidence)}


def promote_best(store: MetadataStore, run_id: str, run_dir: Path, spec: RunSpec) -> dict[str, Any]:
    """Promote the run's best evaluated version (``runs.starting.promote``) as it ends; returns
    what the report records: ``{"version": N, "by": "evaluation", "rule", "evidence"}``, or
    ``{"version": None, "by": None, "why": ...}`` when no point was recorded (nothing is
    promoted; a ``run.not_promoted`` event says why).

    Args:
        store / run_id / run_dir / spec: the run.
    """
    from runs.starting import promote

    keeper = BestEvaluated(run_dir)
    if keeper.best is not None:
        basis = based_on(keeper.best)
        promote(store, run_id, run_dir, keeper.best.policy_version, keeper.weights(), basis)
        return {"version": keeper.best.policy_version, **basis}
    if spec.evaluation.on == "none":
        why = "evaluation.on: none: the run measured no success"
    else:
        why = (
            f"no evaluation point was recorded (evaluation.on: {spec.evaluation.on}: a point "
            "needs evaluation episodes of every task); promote one by hand with robofleet run "
            "promote RUN --version N"
        )
    store.record_event("run.not_promoted", run_id=run_id, why=why)
    return {"version": None, "by": None, "why": why}
