"""The weak initial policy of a run: state normalisation and behaviour cloning on demonstrations.

Every algorithm starts from a policy cloned from a handful of demonstrations (issue 11's weak
start), then learns online:

* HG-DAgger: its update *is* behaviour cloning (MSE on the operator's actions).
* RECAP: its update on demonstrations is behaviour cloning conditioned on "positive" (every
  demonstration step is an intervention, hence forced positive) and fits the value function.
* SAC/RLPD: the actor's pre-squash mean is regressed on ``atanh`` of the demonstrated
  actions and its spread fitted by maximum likelihood given that mean
  (:func:`gaussian_bc_loss`), so the first sampled actions stay close to the demonstrations;
  the critics start untrained, as in RLPD. (Full maximum likelihood on both lets the
  precision weighting of a few rows pull the mean away: on reach, push, drawer-close and
  button-press-topdown it cloned worse.)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from cloud_learner.algorithms.sac_rlpd import SACRLPD
from cloud_learner.core import Batch, Metrics
from cloud_learner.policies.base import TorchPolicy
from cloud_learner.policies.gaussian import GaussianPolicy, tanh_gaussian_log_prob

# Demonstrated actions at the bounds (scripted experts saturate at +-1) would need an infinite
# pre-squash value; they are read as +-0.97 (atanh = 2.09).
_ACTION_LIMIT = 0.97


def fit_state_normalization(algorithm: Any, states: np.ndarray, min_std: float) -> int:
    """Fit ``observation.state`` normalisation (N, D) of every network inside ``algorithm``:
    the policy and, where there are some, value functions, critics and their targets.
    Returns how many networks were set."""
    seen: set[int] = set()
    for value in vars(algorithm).values():
        if not isinstance(value, nn.Module):
            continue
        for module in value.modules():
            if isinstance(module, TorchPolicy) and id(module) not in seen:
                module.set_state_normalization(states, min_std=min_std)
                seen.add(id(module))
    return len(seen)


def gaussian_bc_loss(policy: GaussianPolicy, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(mse, nll), scalars, of the demonstrated actions before the squash,
    ``u = atanh(clip(batch["action"], +-0.97))`` (B, A): ``mean_b |mu - u|^2 / A`` for the
    mean, and the negative log-likelihood of the actions under the tanh-Gaussian with ``mu``
    held fixed, for ``log_std``. Regressing ``mu`` on ``u`` rather than ``tanh(mu)`` on the
    action keeps the mean of a saturated dimension near 2.09 instead of drifting deep into
    the flat part of tanh, where the spread fitted around it would blow up."""
    u = torch.atanh(batch["action"].float().clamp(-_ACTION_LIMIT, _ACTION_LIMIT))
    mean, log_std = policy.distribution(batch)
    mse = ((mean - u) ** 2).mean()
    nll = -tanh_gaussian_log_prob(u, mean.detach(), log_std).mean()
    return mse, nll


def bc_update(algorithm: Any, batch: Batch) -> Metrics:
    """One behaviour-cloning step of ``algorithm``'s policy on demonstrations (see above)."""
    if isinstance(algorithm, SACRLPD):
        policy = algorithm.policy
        policy.train()
        mse, nll = gaussian_bc_loss(policy, batch)
        algorithm.actor_optimizer.zero_grad(set_to_none=True)
        (mse + nll).backward()
        nn.utils.clip_grad_norm_(policy.parameters(), algorithm.config.grad_clip_norm)
        algorithm.actor_optimizer.step()
        return {"bc_mse": float(mse.detach()), "bc_nll": float(nll.detach())}
    metrics: Metrics = algorithm.update(batch)
    return metrics
