"""The weak initial policy of a run: state normalisation, then behaviour cloning on
demonstrations with each algorithm's own ``bc_update``.

Every algorithm starts from a policy cloned from a handful of demonstrations (a weak
start), then learns online:

* HG-DAgger: its update *is* behaviour cloning (MSE on the operator's actions).
* RECAP: its update on demonstrations is behaviour cloning conditioned on "positive" (every
  demonstration step is an intervention, hence forced positive) and fits the value function.
* SAC/RLPD: the actor's pre-squash mean is regressed on ``atanh`` of the demonstrated
  actions and its spread fitted by maximum likelihood given that mean
  (:func:`~cloud_learner.algorithms.sac_rlpd.gaussian_bc_loss`, the objective SAC's
  behaviour regularisation keeps online), so the first sampled actions stay close to the
  demonstrations; the critics start untrained, as in RLPD, and SAC's ``critic_warmup_updates``
  train them on the cloned policy before the actor follows them. (Full maximum likelihood on both lets the
  precision weighting of a few rows pull the mean away: on reach, push, drawer-close and
  button-press-topdown it cloned worse.)
"""

from __future__ import annotations

from typing import Any

import numpy as np
from torch import nn

from cloud_learner.policies.base import TorchPolicy


def fit_state_normalization(
    algorithm: Any, states: np.ndarray, min_std: float, actions: np.ndarray | None = None
) -> int:
    """Fit ``observation.state`` normalisation (N, D) of every network inside ``algorithm``:
    the policy and, where there are some, value functions, critics and their targets; and,
    given ``actions`` (N, A), the action normalisation of a policy that has one (the LeRobot
    adapter's: LeRobot's MEAN_STD). Returns how many networks were set."""
    from cloud_learner.policies.lerobot_adapter import LeRobotPolicyAdapter

    seen: set[int] = set()
    for value in vars(algorithm).values():
        if not isinstance(value, nn.Module):
            continue
        for module in value.modules():
            if id(module) in seen or not isinstance(module, TorchPolicy | LeRobotPolicyAdapter):
                continue
            module.set_state_normalization(states, min_std=min_std)
            if actions is not None and isinstance(module, LeRobotPolicyAdapter):
                module.set_action_normalization(actions, min_std=min_std)
            seen.add(id(module))
    return len(seen)
