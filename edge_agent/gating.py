"""HG-DAgger gating for a simulated operator.

In HG-DAgger (Kelly et al., "HG-DAgger: Interactive Imitation Learning with Human Experts",
ICRA 2019) a human expert watches the novice and takes control when it drifts into unsafe
states, handing control back once the situation is recovered. A scripted expert stands in for
the human here: it takes over when ``||novice - expert|| > threshold`` or when the state is in
a configured risk region, and hands back after ``handback_steps`` consecutive steps in which the
novice's proposal agrees with the expert (distance <= threshold) and the state is outside every
risk region. The k-th agreeing step itself belongs to the expert (the edge agent's rule) or,
with ``handback_step="novice"``, already to the novice (the single-task sync loop of
:mod:`robofleet.app.sim.hgdagger`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from edge_agent.config import RiskRegion


@dataclass(frozen=True)
class GateDecision:
    """One gating decision: who acts and why (``reason`` for logs and tests)."""

    expert_in_control: bool
    distance: float
    reason: str


class HGDaggerGate:
    """Stateful takeover / handback rule; one instance per robot, ``reset`` per episode.

    Args:
        threshold: distance above which the expert takes over (action units).
        handback_steps: k consecutive agreeing steps before control returns to the novice.
        norm: ``"l2"`` or ``"linf"`` of ``novice - expert``.
        risk_regions: state boxes in which the expert always acts.
        handback_step: who acts on the k-th agreeing step, the one that hands control back:
            ``"expert"`` (control returns on the next step) or ``"novice"`` (on this one).

    Raises:
        ValueError: threshold <= 0, handback_steps < 1, handback_step neither ``"expert"`` nor
            ``"novice"``, or a risk region whose dims/low/high lengths differ or whose low
            exceeds high.
    """

    def __init__(
        self,
        threshold: float,
        handback_steps: int,
        norm: Literal["l2", "linf"] = "l2",
        risk_regions: Sequence[RiskRegion] = (),
        handback_step: Literal["expert", "novice"] = "expert",
    ) -> None:
        if threshold <= 0:
            raise ValueError(f"gating threshold must be > 0, got {threshold}")
        if handback_steps < 1:
            raise ValueError(f"handback_steps must be >= 1, got {handback_steps}")
        if handback_step not in ("expert", "novice"):
            raise ValueError(f"handback_step must be 'expert' or 'novice', got {handback_step!r}")
        for i, r in enumerate(risk_regions):
            if not len(r.dims) == len(r.low) == len(r.high):
                raise ValueError(
                    f"risk region {i}: dims, low and high need one entry each "
                    f"(got {len(r.dims)}, {len(r.low)}, {len(r.high)})"
                )
            if any(lo > hi for lo, hi in zip(r.low, r.high, strict=True)):
                raise ValueError(f"risk region {i}: low exceeds high")
        self.threshold = float(threshold)
        self.handback_steps = int(handback_steps)
        self.norm = norm
        self.handback_step = handback_step
        self._regions = [
            (np.asarray(r.dims), np.asarray(r.low, np.float64), np.asarray(r.high, np.float64))
            for r in risk_regions
        ]
        self._expert = False
        self._agree = 0

    @property
    def expert_in_control(self) -> bool:
        return self._expert

    def reset(self) -> None:
        """Start of an episode: the novice acts."""
        self._expert = False
        self._agree = 0

    def distance(self, novice: np.ndarray, expert: np.ndarray) -> float:
        """``||novice - expert||`` in the configured norm. Raises ValueError on shape mismatch."""
        a = np.asarray(novice, np.float64).reshape(-1)
        b = np.asarray(expert, np.float64).reshape(-1)
        if a.shape != b.shape:
            raise ValueError(f"novice action {a.shape} and expert action {b.shape} differ")
        d = a - b
        return float(np.max(np.abs(d)) if self.norm == "linf" else np.linalg.norm(d))

    def in_risk_region(self, state: np.ndarray | None) -> bool:
        if state is None or not self._regions:
            return False
        s = np.asarray(state, np.float64).reshape(-1)
        for dims, lo, hi in self._regions:
            if dims.max() >= s.shape[0]:
                raise ValueError(f"risk region indexes dim {dims.max()} of a {s.shape[0]}-d state")
            v = s[dims]
            if bool(np.all(v >= lo) and np.all(v <= hi)):
                return True
        return False

    def decide(
        self, novice: np.ndarray, expert: np.ndarray, state: np.ndarray | None = None
    ) -> GateDecision:
        """Update the gate with one step and say who acts on it."""
        dist = self.distance(novice, expert)
        risky = self.in_risk_region(state)
        agrees = dist <= self.threshold and not risky
        if not self._expert:
            if risky:
                self._expert, self._agree = True, 0
                return GateDecision(True, dist, "risk_region")
            if not agrees:
                self._expert, self._agree = True, 0
                return GateDecision(True, dist, "divergence")
            return GateDecision(False, dist, "novice")
        # Expert in control: count agreeing steps; the k-th one hands control back.
        self._agree = self._agree + 1 if agrees else 0
        if self._agree >= self.handback_steps:
            self._expert, self._agree = False, 0
            return GateDecision(self.handback_step == "expert", dist, "handback")
        return GateDecision(True, dist, "risk_region" if risky else "expert")
