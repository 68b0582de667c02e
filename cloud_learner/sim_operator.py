"""A simulated human operator for HG-DAgger: a scripted Meta-World expert behind a gate.

The gate follows HG-DAgger's human-gated control (Kelly et al. 2019): the operator watches
the novice and takes over when the novice's action differs from what it would do by more
than ``takeover_threshold`` (max abs over action dims); once in control it hands back after
``handback_steps`` consecutive steps in which the novice agreed (difference within the
threshold). Only steps where the operator acted are labelled (``is_intervention``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class GateDecision:
    """What was executed this step and who chose it."""

    action: np.ndarray
    is_intervention: bool


class SimulatedOperator:
    """Gates between a novice and an expert action; see the module docstring."""

    def __init__(self, takeover_threshold: float = 0.3, handback_steps: int = 5) -> None:
        self.takeover_threshold = takeover_threshold
        self.handback_steps = handback_steps
        self.in_control = False
        self._agreeing = 0

    def reset(self) -> None:
        self.in_control = False
        self._agreeing = 0

    def step(self, novice: np.ndarray, expert: np.ndarray) -> GateDecision:
        """Decide this step's action from the novice's and the expert's proposals (A,)."""
        agree = float(np.max(np.abs(novice - expert))) <= self.takeover_threshold
        if not self.in_control:
            if not agree:
                self.in_control = True
                self._agreeing = 0
        else:
            self._agreeing = self._agreeing + 1 if agree else 0
            if self._agreeing >= self.handback_steps:
                self.in_control = False
                self._agreeing = 0
        if self.in_control:
            return GateDecision(np.asarray(expert, np.float32), True)
        return GateDecision(np.asarray(novice, np.float32), False)
