"""Tanh-squashed Gaussian policy for SAC (Haarnoja et al. 2018, appendix C).

Actions live in [-1, 1]^A. ``sample`` returns ``(action, log_prob)`` with the change-of-variables
correction ``log pi(a) = log N(u; mu, sigma) - sum log(1 - tanh(u)^2)``; ``act`` returns the
deterministic ``tanh(mu)``.
"""

from __future__ import annotations

import math

import torch

from cloud_learner.core import Batch
from cloud_learner.policies.base import PolicySpec, TorchPolicy, mlp
from cloud_learner.policies.mlp import target_actions

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


def tanh_gaussian_log_prob(
    u: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor
) -> torch.Tensor:
    """(B,) log-density of ``a = tanh(u)`` for ``u ~ N(mean, exp(log_std)^2)``, all (B, A)."""
    var = torch.exp(2 * log_std)
    normal = -((u - mean) ** 2) / (2 * var) - log_std - 0.5 * math.log(2 * math.pi)
    # log(1 - tanh(u)^2) written stably: 2 * (log 2 - u - softplus(-2u)).
    correction = 2 * (math.log(2) - u - torch.nn.functional.softplus(-2 * u))
    return (normal - correction).sum(dim=-1)


class GaussianPolicy(TorchPolicy):
    """SAC actor: features -> (mean, log_std) -> tanh-squashed sample."""

    def __init__(self, spec: PolicySpec, text_embeddings: torch.Tensor | None = None) -> None:
        if spec.chunk_size != 1:
            raise ValueError("GaussianPolicy outputs single actions; use chunk_size=1")
        super().__init__(spec, text_embeddings)
        self.head = mlp([self.feature_dim, *spec.widths, 2 * spec.action_dim])

    def distribution(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, log_std), each (B, A); log_std clamped to [-5, 2]."""
        mean, log_std = self.head(self.encode(batch, None)).chunk(2, dim=-1)
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def sample(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised (action (B, A) in [-1, 1], log_prob (B,))."""
        mean, log_std = self.distribution(batch)
        u = mean + torch.exp(log_std) * torch.randn_like(mean)
        return torch.tanh(u), tanh_gaussian_log_prob(u, mean, log_std)

    def predict(self, batch: Batch, indicator: torch.Tensor | None = None) -> torch.Tensor:
        return torch.tanh(self.distribution(batch)[0])

    def bc_loss(self, batch: Batch, indicator: torch.Tensor | None = None) -> torch.Tensor:
        err = (self.predict(batch) - target_actions(batch, self.spec)) ** 2
        return err.mean(dim=1)
