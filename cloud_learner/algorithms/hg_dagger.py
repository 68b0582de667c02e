"""HG-DAgger: human-gated DAgger (Kelly, Sidrane, Driggs-Campbell, Kochenderfer, ICRA 2019,
"HG-DAgger: Interactive Imitation Learning with Human Experts", arXiv:1810.02890).

The robot runs the novice policy; a human (or the simulated operator) takes over when the
novice drifts into unsafe states and hands back once it is satisfied. Only the steps where the
operator acted carry expert labels; they are aggregated with the initial demonstrations
(``is_intervention`` is True for both: an operator chose the action) and the policy is trained
by behaviour cloning on the aggregate. Novice-controlled steps carry no label; by default they
get weight 0, so the loss is exactly the paper's. ``intervention_weight`` up-weights operator
corrections relative to the initial demonstrations (marked by ``is_demonstration`` when the
batch carries it), a common variant (e.g. SOP, Physical Intelligence 2025).

Loss, per batch with per-row BC loss l_i (the policy's own: MSE or flow matching)::

    w_i = intervention_weight   if is_intervention_i and not is_demonstration_i
          demonstration_weight  if is_demonstration_i
          novice_weight         otherwise (default 0: the novice's own actions are no labels)
    loss = sum_i w_i * l_i / max(sum_i w_i, eps)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from buffer.sampling.samplers import InterventionSampler, MixSampler, Sampler
from cloud_learner.algorithms.builder import AlgorithmBuilder, online_share
from cloud_learner.algorithms.common import AlgorithmBase, clipped_step
from cloud_learner.core import Batch, Metrics
from cloud_learner.policies.base import TorchPolicy
from cloud_learner.policies.lerobot_adapter import LeRobotPolicyAdapter
from foundation.runspec import RunParams, RunSpec


@dataclass
class HGDAggerConfig:
    """Hyper-parameters (JSON-able); the three weights are the module docstring's w_i."""

    lr: float = 1e-3
    weight_decay: float = 0.0  # AdamW's
    intervention_weight: float = 1.0
    demonstration_weight: float = 1.0
    novice_weight: float = 0.0
    grad_clip_norm: float = 10.0


def hg_dagger_weights(batch: Batch, cfg: HGDAggerConfig) -> torch.Tensor:
    """(B,) float32 per-row weights as in the module docstring."""
    inter = batch["is_intervention"].bool()
    demo = batch.get("is_demonstration")
    demo = torch.zeros_like(inter) if demo is None else demo.bool()
    w = torch.full(inter.shape, cfg.novice_weight, dtype=torch.float32, device=inter.device)
    w = torch.where(inter, torch.full_like(w, cfg.intervention_weight), w)
    return torch.where(demo, torch.full_like(w, cfg.demonstration_weight), w)


class HGDAgger(AlgorithmBase):
    """Behaviour cloning on aggregated operator labels (see module docstring)."""

    name = "hg_dagger"

    def __init__(
        self, policy: TorchPolicy | LeRobotPolicyAdapter, config: HGDAggerConfig | None = None
    ) -> None:
        self.policy = policy
        self.config = config or HGDAggerConfig()
        self.optimizer = torch.optim.AdamW(
            policy.parameters(), lr=self.config.lr, weight_decay=self.config.weight_decay
        )
        self.updates = 0

    def loss(self, batch: Batch) -> tuple[torch.Tensor, Metrics]:
        """Weighted BC loss (scalar) and metrics, without stepping the optimizer.

        A policy whose loss is only a batch mean (``per_row_loss = False``, e.g. LeRobot's ACT)
        is trained on the rows with non-zero weight; the weights' sizes are then ignored.
        """
        w = hg_dagger_weights(batch, self.config)
        if getattr(self.policy, "per_row_loss", True):
            per_row = self.policy.bc_loss(batch)
            loss = (w * per_row).sum() / w.sum().clamp_min(1e-8)
        else:
            keep = w > 0
            loss = self.policy.bc_loss({k: v[keep] for k, v in batch.items()})
        labelled = float((w > 0).float().mean())
        return loss, {"loss": float(loss.detach()), "labelled_fraction": labelled}

    def update(self, batch: Batch) -> Metrics:
        self.policy.train()
        loss, metrics = self.loss(batch)
        params = self.policy.parameters()
        grad = clipped_step(self.optimizer, loss, params, self.config.grad_clip_norm)
        self.updates += 1
        metrics["grad_norm"] = float(grad)
        return metrics

    def parts(self) -> dict[str, torch.nn.Module | torch.optim.Optimizer]:
        return {"policy": self.policy, "optimizer": self.optimizer}


class HGDAggerBuilder(AlgorithmBuilder):
    """HG-DAgger in a run: trains on operator-labelled steps only (the buffer's
    intervention sampler: demonstrations and takeovers); fixed-length episodes."""

    name = "hg-dagger"
    learner_name = "hg_dagger"
    display_name = "HG-DAgger"
    needs_operator = True
    learns_from = "interventions"
    learner_sampler = "intervention"
    # Behaviour cloning trains any policy with a BC loss, LeRobot's included.
    policy_kinds = (
        "mlp",
        "cnn",
        "flow-chunk",
        "lerobot-act",
        "lerobot-diffusion",
        "lerobot-smolvla",
        "lerobot-pi0",
    )

    def build(self, policy: Any, config: dict[str, Any]) -> HGDAgger:
        return HGDAgger(policy, HGDAggerConfig(**config))

    def algorithm_config(self, options: Any, run: RunParams, spec: RunSpec) -> dict[str, Any]:
        return {"lr": run.lr}

    def sampler(
        self, options: Any, spec: RunSpec, offline: bool, shares: Mapping[str, float]
    ) -> Sampler | None:
        """Operator-labelled steps; with offline data mounted, those against the mounted
        rows at the run's online share."""
        if not offline:
            return InterventionSampler()
        share = online_share(spec, offline, shares)
        fraction = spec.buffer.online_fraction
        return MixSampler(share, prior="offline", online="interventions", default=fraction)
