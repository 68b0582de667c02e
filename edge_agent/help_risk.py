"""The risk signal a robot asks for help from (``help.risk``), computed here each step from the
policy alone (no simulator's help).

* :class:`ProbeRisk` (``probe``): the help probe shipped beside the policy
  (``cloud_learner.help_probe``) on the activations of the policy's head, read by a forward
  hook while the policy acts; no risk until the first version carries a probe.
* :class:`EnsembleRisk` (``ensemble``): the disagreement of the last ``members`` policy versions
  this robot applied: each older version acts on the same observation, and the risk is the
  mean over action dimensions of the actions' standard deviation across the versions, clipped
  to [0, 1] (robofleet's actions are normalised to [-1, 1], so 1 is the largest spread). The
  repo's policies are single networks (the SAC critic ensemble lives in the learner, not on
  the robot), so the versions a run published are the ensemble; no risk until two arrived.

* :class:`RandomRisk` (``random``): a baseline with no signal: 1 with probability ``rate`` at
  each step, else 0 (requests at random times).

Probe and ensemble need the policy on the robot (local inference) and compute on a fresh chunk only: the
steps of one action chunk share its risk.
"""

from __future__ import annotations

import copy
import logging
from collections import deque
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from cloud_learner.help_probe import ActivationTap, HelpProbe, HelpProbeError, read_card
from edge_agent.core import Observation

log = logging.getLogger(__name__)


class RiskSource(Protocol):
    """``risk`` after the policy acted: a value in [0, 1], or None (no signal yet)."""

    def risk(self, obs: Observation, task: int, proposed: np.ndarray, fresh: bool) -> float | None:
        """``fresh``: the policy computed a new chunk on ``obs`` at this step."""
        ...

    def offer_weights(self, weights: Mapping[str, Any]) -> None: ...


def _torch_policy(runner: Any) -> Any:
    policy = getattr(runner, "policy", None)
    if policy is None:
        raise ValueError(
            "help.risk needs the policy on the robot (local inference); this robot's runner "
            f"{type(runner).__name__} has none"
        )
    return policy


class ProbeRisk:
    """The shipped probe on the head's activations (module docstring)."""

    def __init__(self, runner: Any) -> None:
        policy = _torch_policy(runner)
        self.tap = ActivationTap(lambda: getattr(policy, "policy", policy))
        self.probe: HelpProbe | None = None
        self._last: float | None = None

    def risk(self, obs: Observation, task: int, proposed: np.ndarray, fresh: bool) -> float | None:
        if self.probe is None:
            return None
        if fresh and self.tap.last is not None:
            self._last = float(self.probe.risk(self.tap.last[-1:])[0])
        return self._last

    def offer_weights(self, weights: Mapping[str, Any]) -> None:
        """Hook the (possibly rebuilt) policy; take the version's probe when it carries a new
        one. An unreadable probe is logged and the running one kept."""
        try:
            self.tap.attach()
            card = read_card(weights)
            if card is None or (self.probe and int(card["version"]) == self.probe.version):
                return
            self.probe = HelpProbe.from_tensors(weights)
            self._last = None
        except (HelpProbeError, KeyError, ValueError) as exc:
            log.error("keeping help probe: %s", exc)
            return
        log.info("help probe version %d applied", self.probe.version)


class EnsembleRisk:
    """The spread of the last ``members`` applied versions' actions (module docstring)."""

    def __init__(self, runner: Any, members: int) -> None:
        if members < 2:
            raise ValueError(f"an ensemble needs >= 2 members, got {members}")
        self._policy = _torch_policy(runner)
        self.members: deque[Any] = deque(maxlen=members - 1)  # older versions
        self._current: Any = None
        self._last: float | None = None

    def risk(self, obs: Observation, task: int, proposed: np.ndarray, fresh: bool) -> float | None:
        if not self.members:
            return None
        if fresh:
            first = np.asarray(proposed, np.float32).reshape(-1)
            actions: list[np.ndarray] = [first]
            for member in self.members:
                out = np.asarray(member.act(obs, task), np.float32)
                actions.append(out[0] if out.ndim == 2 else out)
            spread = np.stack(actions).std(axis=0).mean()
            self._last = float(np.clip(spread, 0.0, 1.0))
        return self._last

    def offer_weights(self, weights: Mapping[str, Any]) -> None:
        """Keep a copy of the version the runner just applied; the one before joins the
        members."""
        if self._current is not None:
            self.members.append(self._current)
        self._current = copy.deepcopy(self._policy)
        self._last = None


class RandomRisk:
    """Risk 1.0 with probability ``rate`` at each step, else 0.0 (module docstring)."""

    def __init__(self, rate: float, seed: int | None = None) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"help.random_rate must be in [0, 1], got {rate}")
        self.rate = rate
        self._rng = np.random.default_rng(seed)

    def risk(self, obs: Observation, task: int, proposed: np.ndarray, fresh: bool) -> float:
        return 1.0 if self._rng.random() < self.rate else 0.0

    def offer_weights(self, weights: Mapping[str, Any]) -> None:
        pass


def make_risk(
    kind: str, runner: Any, members: int = 3, random_rate: float = 0.0
) -> RiskSource | None:
    """The run's ``help.risk`` on this robot; None for ``none``.

    Raises:
        ValueError: an unknown kind, or a runner without a local policy.
    """
    if kind == "none":
        return None
    if kind == "probe":
        return ProbeRisk(runner)
    if kind == "ensemble":
        return EnsembleRisk(runner, members)
    if kind == "random":
        return RandomRisk(random_rate)
    raise ValueError(f"help.risk must be probe, ensemble, random or none, got {kind!r}")
