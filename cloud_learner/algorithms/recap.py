"""RECAP: RL with Experience and Corrections via Advantage-conditioned Policies
(Physical Intelligence 2025, "pi*0.6: a VLA That Learns From Experience", arXiv:2511.14759).

Read top to bottom; each numbered step is one part of the paper's recipe.

1. Sparse returns. Every step costs -1; an episode that ends without success pays an extra
   ``-failure_penalty``. Success is ``batch["success"]`` when present, else
   ``terminated & reward > 0`` (a sparse success reward). Returns are scaled by
   ``return_scale`` (the paper normalises them to about (-1, 0)).
2. Value function V(s, task), trained by regression on the n-step return
   ``G = sum_{k<N} gamma^k r_{t+k} + gamma^N (1 - done) V_target(s_{t+N})``.
   A batch with ``reward`` of shape (B, N) is an N-step window: ``reward[:, k]`` is r_{t+k},
   ``terminated``/``truncated`` are (B, N) and ``next.observation.state`` is s_{t+N}; a (B,)
   reward is the 1-step case.
3. n-step advantage ``A = G - V(s_t)`` (same window, value network without gradient).
4. Improvement indicator ``I = 1[A > eps_task]`` with a per-task threshold ``eps_task``: an
   exponential moving average of the batch's ``(1 - positive_fraction)`` advantage quantile
   for that task, so about ``positive_fraction`` of each task's data is labelled positive.
5. Interventions are forced positive: ``I = 1`` where ``is_intervention`` (operator corrections
   are by definition improvements).
6. Indicator dropout: with probability ``indicator_dropout`` the indicator is replaced by NULL,
   training the unconditional branch used by classifier-free guidance.
7. Policy loss: the policy's own BC loss (flow matching or MSE) conditioned on I, over all rows.
8. Inference (on the robot): condition on I = positive with guidance weight ``guidance_weight``;
   ``a = a(null) + w (a(positive) - a(null))`` (``TorchPolicy.predict_guided``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from buffer.sampling.samplers import MixSampler, Sampler
from cloud_learner.algorithms.builder import AlgorithmBuilder, online_share
from cloud_learner.algorithms.common import AlgorithmBase, clipped_step
from cloud_learner.core import Batch, Metrics
from cloud_learner.policies.base import (
    INDICATOR_NEGATIVE,
    INDICATOR_NULL,
    INDICATOR_POSITIVE,
    TorchPolicy,
)
from cloud_learner.policies.mlp import MLPPolicy
from foundation.runspec import RunParams, RunSpec, knob


@dataclass
class RECAPConfig:
    """Hyper-parameters; JSON-able."""

    lr: float = 3e-4
    value_lr: float = 3e-4
    gamma: float = 1.0
    failure_penalty: float = 100.0
    return_scale: float = 0.005
    positive_fraction: float = 0.3
    threshold_ema: float = 0.05
    indicator_dropout: float = 0.3
    guidance_weight: float = 1.0
    target_tau: float = 0.005
    grad_clip_norm: float = 10.0


def sparse_rewards(batch: Batch, cfg: RECAPConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 1: (rewards, done), each (B, N) float32, rewards already scaled."""
    reward = batch["reward"].float()
    window = reward if reward.ndim == 2 else reward[:, None]
    term = batch["terminated"].bool().reshape(window.shape)
    trunc = batch["truncated"].bool().reshape(window.shape)
    if "success" in batch:
        success = batch["success"].bool().reshape(window.shape)
    else:
        success = term & (window > 0)
    done = term | trunc
    r = -1.0 - cfg.failure_penalty * (done & ~success).float()
    # Steps after the episode ended inside the window contribute nothing.
    alive = torch.cumprod(torch.cat([torch.ones_like(done[:, :1]), ~done[:, :-1]], 1).float(), 1)
    return r * alive * cfg.return_scale, done.float() * alive


def nstep_return(
    rewards: torch.Tensor, done: torch.Tensor, bootstrap: torch.Tensor, gamma: float
) -> torch.Tensor:
    """Step 2: (B,) ``sum_k gamma^k r_k + gamma^N (1 - any done) bootstrap``; inputs (B, N), (B,)."""
    n = rewards.shape[1]
    discounts = gamma ** torch.arange(n, dtype=rewards.dtype, device=rewards.device)
    ended = done.amax(dim=1)
    return (rewards * discounts).sum(1) + (gamma**n) * (1.0 - ended) * bootstrap


def improvement_indicator(
    advantage: torch.Tensor,
    task: torch.Tensor,
    thresholds: torch.Tensor,
    is_intervention: torch.Tensor,
) -> torch.Tensor:
    """Steps 4-5: (B,) int64, POSITIVE where A > eps_task or an operator acted, else NEGATIVE."""
    positive = (advantage > thresholds[task]) | is_intervention.bool()
    return torch.where(positive, INDICATOR_POSITIVE, INDICATOR_NEGATIVE).long()


class RECAP(AlgorithmBase):
    """Advantage-conditioned policy learning (see module docstring)."""

    name = "recap"

    def __init__(self, policy: TorchPolicy, config: RECAPConfig | None = None) -> None:
        if not policy.spec.indicator:
            raise ValueError("RECAP needs a policy built with PolicySpec(indicator=True)")
        self.policy = policy
        self.config = config or RECAPConfig()
        policy.inference_indicator = INDICATOR_POSITIVE
        policy.guidance_weight = self.config.guidance_weight
        # The value function sees state and task, not the cameras: its bootstrap reads
        # next.observation.state alone, so a camera policy needs no successor frames.
        vspec = replace(policy.spec, action_dim=1, chunk_size=1, indicator=False, image_keys=[])
        self.value = MLPPolicy(vspec)
        self.value_target = copy.deepcopy(self.value).requires_grad_(False)
        self.optimizer = torch.optim.AdamW(policy.parameters(), lr=self.config.lr)
        self.value_optimizer = torch.optim.AdamW(self.value.parameters(), lr=self.config.value_lr)
        device = next(policy.parameters()).device
        self.value.to(device)
        self.value_target.to(device)
        self.thresholds = torch.zeros(policy.spec.num_tasks, device=device)
        self.thresholds_seen = torch.zeros(policy.spec.num_tasks, dtype=torch.bool)
        self.updates = 0

    def _v(self, net: MLPPolicy, batch: Batch, state_key: str) -> torch.Tensor:
        obs = dict(batch)
        obs["observation.state"] = batch[state_key]
        return net.predict(obs)[:, 0]

    def _update_thresholds(self, advantage: torch.Tensor, task: torch.Tensor) -> None:
        q = 1.0 - self.config.positive_fraction
        for t in task.unique().tolist():
            quantile = torch.quantile(advantage[task == t], q)
            if not self.thresholds_seen[t]:
                self.thresholds[t] = quantile
                self.thresholds_seen[t] = True
            else:
                ema = self.config.threshold_ema
                self.thresholds[t] = (1 - ema) * self.thresholds[t] + ema * quantile

    def update(self, batch: Batch) -> Metrics:
        cfg = self.config
        task = batch["task_index"].long()
        rewards, done = sparse_rewards(batch, cfg)
        with torch.no_grad():
            bootstrap = self._v(self.value_target, batch, "next.observation.state")
            target = nstep_return(rewards, done, bootstrap, cfg.gamma)
        value = self._v(self.value, batch, "observation.state")
        value_loss = ((value - target) ** 2).mean()
        clipped_step(self.value_optimizer, value_loss, self.value.parameters(), cfg.grad_clip_norm)
        with torch.no_grad():
            for p, pt in zip(self.value.parameters(), self.value_target.parameters(), strict=True):
                pt.lerp_(p, cfg.target_tau)
            advantage = target - self._v(self.value, batch, "observation.state")
            self._update_thresholds(advantage, task)
            indicator = improvement_indicator(
                advantage, task, self.thresholds, batch["is_intervention"]
            )
            drop = torch.rand(indicator.shape, device=indicator.device) < cfg.indicator_dropout
            conditioned = torch.where(drop, INDICATOR_NULL, indicator)
        self.policy.train()
        policy_loss = self.policy.bc_loss(batch, conditioned).mean()
        clipped_step(self.optimizer, policy_loss, self.policy.parameters(), cfg.grad_clip_norm)
        self.updates += 1
        return {
            "loss": float(policy_loss.detach()),
            "value_loss": float(value_loss.detach()),
            "advantage_mean": float(advantage.mean()),
            "positive_fraction": float((indicator == INDICATOR_POSITIVE).float().mean()),
        }

    def parts(self) -> dict[str, torch.nn.Module | torch.optim.Optimizer]:
        return {
            "policy": self.policy,
            "value": self.value,
            "value_target": self.value_target,
            "optimizer": self.optimizer,
            "value_optimizer": self.value_optimizer,
        }

    def extra_state(self) -> dict[str, Any]:
        return {
            "thresholds": self.thresholds.clone(),
            "thresholds_seen": self.thresholds_seen.clone(),
        }

    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        self.thresholds = state["thresholds"].clone().to(self.thresholds.device)
        self.thresholds_seen = state["thresholds_seen"].clone().bool()


@dataclass(frozen=True)
class RECAPOptions:
    """RECAP's hyper-parameters in a run spec.

    Attributes:
        guidance_weight: classifier-free guidance weight w of the robots'
            "positive"-conditioned actions (1 = plain conditioning).
        positive_fraction: share of each task's data labelled an improvement.
        indicator_dropout: probability of training the unconditional branch.
    """

    guidance_weight: float = knob(1.0)
    positive_fraction: float = knob(0.3, within=(lambda v: 0 < v < 1, "(0, 1)"))
    indicator_dropout: float = knob(0.3, zero_ok=True, within=(lambda v: 0 <= v < 1, "[0, 1)"))


class RECAPBuilder(AlgorithmBuilder):
    """RECAP in a run: every step sampled uniformly; robots end episodes (``terminated``) at
    success. It ignores the robots' reward and uses pi*0.6's sparse return: -1 per step and a
    failure penalty of one episode length when an episode ends without success, scaled by
    ``1 / (2 * max_episode_steps)`` into [-1, 0]."""

    name = "recap"
    learner_name = "recap"
    display_name = "RECAP"
    options = RECAPOptions
    terminate_on_success = True
    learns_from = "success"
    indicator = True
    # Its policy takes the improvement indicator: robofleet's own policies only.
    policy_kinds = ("mlp", "cnn", "flow-chunk")

    def build(self, policy: Any, config: dict[str, Any]) -> RECAP:
        return RECAP(policy, RECAPConfig(**config))

    def algorithm_config(self, options: Any, run: RunParams, spec: RunSpec) -> dict[str, Any]:
        assert isinstance(options, RECAPOptions)
        horizon = run.max_episode_steps
        return {
            "lr": run.lr,
            "value_lr": run.lr,
            "guidance_weight": options.guidance_weight,
            "positive_fraction": options.positive_fraction,
            "indicator_dropout": options.indicator_dropout,
            "failure_penalty": float(horizon),
            "return_scale": 1.0 / (2.0 * horizon),
        }

    def sampler(
        self, options: Any, spec: RunSpec, offline: bool, shares: Mapping[str, float]
    ) -> Sampler | None:
        """Every step alike; with offline data mounted, the window against the mounted rows
        at the run's online share."""
        if not offline:
            return None
        share = online_share(spec, offline, shares)
        return MixSampler(share, prior="offline", default=spec.buffer.online_fraction)
