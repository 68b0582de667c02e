"""Generative action-chunk head trained by flow matching (conditional rectified flow).

Source: Lipman et al. 2023, "Flow Matching for Generative Modeling"; Liu et al. 2023,
"Flow Straight and Fast"; the same objective as pi0's action expert (Black et al. 2024).

Training, for a target chunk x1 (B, T, A), noise x0 ~ N(0, I) and time t ~ U(0, 1)::

    x_t = (1 - t) * x0 + t * x1,    target velocity u = x1 - x0
    loss = mean over (T, A) of (v_theta(x_t, t, features) - u)^2        -> (B,)

Sampling integrates dx/dt = v_theta from t = 0 (noise) to 1 with ``num_steps`` Euler steps.
Classifier-free guidance (RECAP) is applied to the velocity at each step.
"""

from __future__ import annotations

import torch

from cloud_learner.core import Batch
from cloud_learner.policies.base import INDICATOR_NULL, PolicySpec, TorchPolicy, mlp
from cloud_learner.policies.mlp import target_actions


class FlowMatchingPolicy(TorchPolicy):
    """Flow-matching head over action chunks (T = ``spec.chunk_size``, may be 1)."""

    def __init__(
        self,
        spec: PolicySpec,
        text_embeddings: torch.Tensor | None = None,
        num_steps: int = 10,
    ) -> None:
        super().__init__(spec, text_embeddings)
        self.num_steps = num_steps
        self.flat = spec.action_dim * spec.chunk_size
        self.velocity = mlp([self.feature_dim + self.flat + 1, *spec.widths, self.flat])

    def _v(self, features: torch.Tensor, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.velocity(torch.cat([features, x, t[:, None]], dim=-1))
        return out

    def bc_loss(
        self,
        batch: Batch,
        indicator: torch.Tensor | None = None,
        noise: torch.Tensor | None = None,
        time: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B,) flow-matching loss; ``noise`` (B, T*A) and ``time`` (B,) may be fixed (tests)."""
        x1 = target_actions(batch, self.spec).reshape(-1, self.flat)
        b = x1.shape[0]
        x0 = torch.randn_like(x1) if noise is None else noise.reshape(b, self.flat)
        t = torch.rand(b, device=x1.device) if time is None else time
        xt = (1 - t[:, None]) * x0 + t[:, None] * x1
        v = self._v(self.encode(batch, indicator), xt, t)
        return ((v - (x1 - x0)) ** 2).mean(dim=1)

    def _sample(self, batch: Batch, cond: torch.Tensor | None, weight: float) -> torch.Tensor:
        feats = self.encode(batch, cond)
        null_feats = None
        if cond is not None and weight != 1.0:
            null_feats = self.encode(batch, torch.full_like(cond, INDICATOR_NULL))
        b = feats.shape[0]
        x = torch.randn(b, self.flat, device=feats.device)
        dt = 1.0 / self.num_steps
        for i in range(self.num_steps):
            t = torch.full((b,), i * dt, device=feats.device)
            v = self._v(feats, x, t)
            if null_feats is not None:
                v_null = self._v(null_feats, x, t)
                v = v_null + weight * (v - v_null)
            x = x + dt * v
        if self.spec.chunk_size > 1:
            return x.view(b, self.spec.chunk_size, self.spec.action_dim)
        return x

    def predict(self, batch: Batch, indicator: torch.Tensor | None = None) -> torch.Tensor:
        return self._sample(batch, indicator, 1.0)

    def predict_guided(self, batch: Batch) -> torch.Tensor:
        """Sampling conditioned on ``inference_indicator``, CFG applied to the velocity."""
        if self.inference_indicator is None or self.indicator_embedding is None:
            return self._sample(batch, None, 1.0)
        b = batch["observation.state"].shape[0]
        cond = torch.full(
            (b,),
            self.inference_indicator,
            dtype=torch.long,
            device=batch["observation.state"].device,
        )
        return self._sample(batch, cond, self.guidance_weight)
