"""SAC with RLPD's recipe for learning from prior data.

Sources: Haarnoja et al. 2018, "Soft Actor-Critic Algorithms and Applications"
(arXiv:1812.05905); Ball, Smith, Kostrikov, Levine 2023, "Efficient Online Reinforcement
Learning with Offline Data" (RLPD, arXiv:2302.02948); TD3+BC (Fujimoto & Gu 2021,
arXiv:2106.06860) for ``bc_weight``. LayerNorm critics and a min over a random subset of an
ensemble of E critics are here; symmetric sampling is the builder's sampler. The losses per
batch and the warm-start remedies (:class:`SACOptions`) are in ``docs/learner.md``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from buffer.sampling.samplers import MixSampler, Sampler
from cloud_learner.algorithms.builder import AlgorithmBuilder, online_share
from cloud_learner.algorithms.common import AlgorithmBase, clipped_step
from cloud_learner.core import Batch, Metrics
from cloud_learner.policies.base import TorchPolicy
from cloud_learner.policies.gaussian import GaussianPolicy, tanh_gaussian_log_prob
from foundation.runspec import RunParams, RunSpec, knob


@dataclass
class SACConfig:
    """Hyper-parameters (JSON-able); the remedies' are :class:`SACOptions`'."""

    lr: float = 3e-4  # actor, critics and temperature alike
    gamma: float = 0.99
    tau: float = 0.005  # Polyak rate of the target critics
    num_critics: int = 2  # E
    critic_subset: int = 2  # critics the TD target takes the minimum over
    hidden: int = 256  # width of the critics' hidden layers
    init_temperature: float = 0.1
    grad_clip_norm: float = 10.0
    target_entropy: float | None = None  # None: -action_dim
    critic_warmup_updates: int = 0
    bc_weight: float = 0.0


# Operator actions at the bounds (scripted experts saturate at +-1) would need an infinite
# pre-squash value; they are read as +-0.97 (atanh = 2.09).
ACTION_LIMIT = 0.97


def gaussian_bc_loss(
    policy: GaussianPolicy, batch: Batch, rows: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(mse, nll), scalars, of the batch's actions before the squash,
    ``u = atanh(clip(batch["action"], +-0.97))`` (B, A): ``mean |mu - u|^2`` over rows and
    dimensions for the mean, and the mean negative log-likelihood of the actions under the
    tanh-Gaussian with ``mu`` held fixed, for ``log_std``. ``rows`` (B,) bool selects rows
    (None: all; none selected: two zeros). Regressing ``mu`` on ``u`` rather than
    ``tanh(mu)`` on the action keeps the mean of a saturated dimension near 2.09 instead of
    drifting deep into the flat part of tanh, where the spread fitted around it would blow up.
    """
    action = batch["action"].float()
    mean, log_std = policy.distribution(batch)
    if rows is not None:
        if not bool(rows.any()):
            zero = mean.sum() * 0.0
            return zero, zero
        action, mean, log_std = action[rows], mean[rows], log_std[rows]
    u = torch.atanh(action.clamp(-ACTION_LIMIT, ACTION_LIMIT))
    mse = ((mean - u) ** 2).mean()
    nll = -tanh_gaussian_log_prob(u, mean.detach(), log_std).mean()
    return mse, nll


class Critic(nn.Module):
    """Q(s, a) with LayerNorm after each hidden layer (RLPD). Features come from an encoder
    shaped like the actor's (state, cameras, task)."""

    def __init__(self, encoder: TorchPolicy, action_dim: int, hidden: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.net = nn.Sequential(
            nn.Linear(encoder.feature_dim + action_dim, hidden),
            nn.LayerNorm(hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.LayerNorm(hidden),
            nn.ReLU(),
            nn.Linear(hidden, 1),
        )

    def forward(self, batch: Batch, action: torch.Tensor) -> torch.Tensor:
        feats = self.encoder.encode(batch, None)
        out: torch.Tensor = self.net(torch.cat([feats, action], -1))[:, 0]
        return out


def critic_target(
    reward: torch.Tensor,
    terminated: torch.Tensor,
    next_q: torch.Tensor,
    next_log_prob: torch.Tensor,
    alpha: float,
    gamma: float,
) -> torch.Tensor:
    """(B,) soft TD target; ``next_q`` is (K, B) for the K critics of the subset."""
    soft = next_q.min(dim=0).values - alpha * next_log_prob
    return reward.float() + gamma * (1.0 - terminated.float()) * soft


def actor_loss(q: torch.Tensor, log_prob: torch.Tensor, alpha: float) -> torch.Tensor:
    """Scalar ``mean_b(alpha logp - mean_i Q_i)``; ``q`` is (E, B)."""
    return (alpha * log_prob - q.mean(dim=0)).mean()


class SACRLPD(AlgorithmBase):
    """Soft actor-critic with RLPD's critic ensemble and LayerNorm (see module docstring)."""

    name = "sac_rlpd"

    def __init__(self, policy: GaussianPolicy, config: SACConfig | None = None) -> None:
        self.policy = policy
        self.config = cfg = config or SACConfig()
        if not 1 <= cfg.critic_subset <= cfg.num_critics:
            raise ValueError(
                f"critic_subset must be in [1, num_critics={cfg.num_critics}], "
                f"got {cfg.critic_subset}"
            )
        bad = {
            "critic_warmup_updates": "must be >= 0" if cfg.critic_warmup_updates < 0 else "",
            "bc_weight": "must be >= 0" if cfg.bc_weight < 0 else "",
            "init_temperature": "must be > 0" if cfg.init_temperature <= 0 else "",
        }
        wrong = [f"{k} {why}, got {getattr(cfg, k)!r}" for k, why in bad.items() if why]
        if wrong:
            raise ValueError("SACConfig: " + "; ".join(wrong))
        a = policy.spec.action_dim
        self.critics = nn.ModuleList(
            Critic(GaussianPolicy(policy.spec), a, cfg.hidden) for _ in range(cfg.num_critics)
        )
        device = next(policy.parameters()).device
        self.critics.to(device)
        self.critics_target = copy.deepcopy(self.critics).requires_grad_(False)
        self.log_alpha = torch.tensor(math.log(cfg.init_temperature), device=device)
        self.log_alpha.requires_grad_(True)
        self.target_entropy = -float(a) if cfg.target_entropy is None else cfg.target_entropy
        self.actor_optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
        self.critic_optimizer = torch.optim.Adam(self.critics.parameters(), lr=cfg.lr)
        self.alpha_optimizer = torch.optim.Adam([self.log_alpha], lr=cfg.lr)
        self.updates = 0

    def _next_batch(self, batch: Batch) -> Batch:
        nxt = dict(batch)
        nxt["observation.state"] = batch["next.observation.state"]
        for key in list(batch):
            if key.startswith("next.observation.images."):
                nxt[key.removeprefix("next.")] = batch[key]
        return nxt

    def update(self, batch: Batch) -> Metrics:
        cfg = self.config
        alpha = float(self.log_alpha.detach().exp())
        nxt = self._next_batch(batch)
        with torch.no_grad():
            next_action, next_logp = self.policy.sample(nxt)
            subset = torch.randperm(cfg.num_critics)[: cfg.critic_subset].tolist()
            next_q = torch.stack([self.critics_target[i](nxt, next_action) for i in subset])
            y = critic_target(
                batch["reward"], batch["terminated"], next_q, next_logp, alpha, cfg.gamma
            )
        q = torch.stack([c(batch, batch["action"].float()) for c in self.critics])
        critic_loss = ((q - y[None]) ** 2).mean(dim=1).sum()
        critics = self.critics.parameters()
        clipped_step(self.critic_optimizer, critic_loss, critics, cfg.grad_clip_norm)

        metrics: Metrics = {
            "critic_loss": float(critic_loss.detach()),
            "q_mean": float(q.detach().mean()),
            "alpha": alpha,
        }
        frozen = self.updates < cfg.critic_warmup_updates
        metrics.update(self._update_actor_and_temperature(batch, alpha, step=not frozen))
        with torch.no_grad():
            for p, pt in zip(
                self.critics.parameters(), self.critics_target.parameters(), strict=True
            ):
                pt.lerp_(p, cfg.tau)
        self.updates += 1
        metrics["actor_frozen"] = float(self.updates <= cfg.critic_warmup_updates)
        return metrics

    def _update_actor_and_temperature(self, batch: Batch, alpha: float, step: bool) -> Metrics:
        """Actor and temperature losses; their optimizer steps only when ``step`` (during the
        critic warm-up the losses are still reported, so the curves have no gap)."""
        cfg = self.config
        self.critics.requires_grad_(False)
        with torch.set_grad_enabled(step):
            action, logp = self.policy.sample(batch)
            q_pi = torch.stack([c(batch, action) for c in self.critics])
            loss_pi = actor_loss(q_pi, logp, alpha)
            out: Metrics = {"q_pi": float(q_pi.detach().mean())}
            if cfg.bc_weight > 0:
                # TD3+BC: the Q term normalised by its own (detached) magnitude.
                scale = q_pi.detach().mean(dim=0).abs().mean().clamp_min(1e-6)
                rows = batch["is_intervention"].bool()
                mse, nll = gaussian_bc_loss(self.policy, batch, rows)
                loss_pi = loss_pi / scale + cfg.bc_weight * (mse + nll)
                out.update(bc_mse=float(mse.detach()), bc_nll=float(nll.detach()))
        self.critics.requires_grad_(True)
        out.update(loss=float(loss_pi.detach()), entropy=float(-logp.detach().mean()))
        if not step:
            return out
        clipped_step(self.actor_optimizer, loss_pi, self.policy.parameters(), cfg.grad_clip_norm)

        temp_loss = -(self.log_alpha * (logp.detach() + self.target_entropy)).mean()
        self.alpha_optimizer.zero_grad(set_to_none=True)
        temp_loss.backward()
        self.alpha_optimizer.step()
        return out

    def parts(self) -> dict[str, torch.nn.Module | torch.optim.Optimizer]:
        return {
            "policy": self.policy,
            "critics": self.critics,
            "critics_target": self.critics_target,
            "actor_optimizer": self.actor_optimizer,
            "critic_optimizer": self.critic_optimizer,
            "alpha_optimizer": self.alpha_optimizer,
        }

    def extra_state(self) -> dict[str, Any]:
        return {"log_alpha": self.log_alpha.detach().clone()}

    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])

    def bc_update(self, batch: Batch) -> Metrics:
        """One behaviour-cloning step of the actor alone (the run's warm start): the
        pre-squash mean towards ``atanh`` of the demonstrated actions, the spread by
        likelihood around it (:func:`gaussian_bc_loss`); the critics start untrained, as in
        RLPD, and ``critic_warmup_updates`` train them on the cloned actor before it follows
        them. (Full maximum likelihood on both lets the precision weighting of a few rows pull
        the mean away: on reach, push, drawer-close and button-press-topdown it cloned worse.)"""
        policy = self.policy
        policy.train()
        mse, nll = gaussian_bc_loss(policy, batch)
        clipped_step(
            self.actor_optimizer, mse + nll, policy.parameters(), self.config.grad_clip_norm
        )
        return {"bc_mse": float(mse.detach()), "bc_nll": float(nll.detach())}


@dataclass(frozen=True)
class SACOptions:
    """SAC/RLPD's hyper-parameters in a run spec.

    Attributes:
        gamma: discount per control step.
        reward_scale: multiplies the robots' reward (Meta-World's dense shaped reward lies in
            [0, 10] per step, 10 at the goal; 0.1 maps it into [0, 1]).
        init_temperature: initial entropy temperature alpha. 0.01: with rewards in [0, 1]
            per step, alpha = 0.1 would pay an entropy bonus (about 0.1 * 4 nats per step) as
            large as the task's reward, and widen the cloned actor.
        target_entropy: the temperature's target entropy in nats (SAC's -A heuristic, -4 for
            Meta-World's 4-d action). The cloned actor starts near -2, so alpha falls and
            stops widening it.
        critic_warmup_updates: first online updates that train the critics alone (actor and
            alpha frozen): RLPD's critics start untrained, and an actor that follows them at
            once forgets the warm start (offline-to-online practice).
        bc_weight: weight of TD3+BC's behaviour term on operator rows against the Q term
            normalised by ``mean |Q|`` (Fujimoto & Gu 2021, whose alpha = 2.5 would be 0.4;
            our term is in pre-squash units, larger, and 1.0 held the clone better in
            tests/cloud_learner/test_sac_warm_start.py); 0 = plain SAC.

    Measured with ``robofleet demo --algorithm sac --robots 2 --minutes 3``: without the
    warm-start protection the policy's own success fell from 0.35 to 0.00 at the first
    evaluation and ended at 0.25 with 1.00 of steps intervened; with it 0.25 -> 0.55
    (0.40-0.75 along the run) at 0.94.
    """

    gamma: float = knob(0.99, within=(lambda v: 0 < v <= 1, "(0, 1]"))
    reward_scale: float = knob(0.1)
    init_temperature: float = knob(0.01)
    target_entropy: float = knob(-4.0, signed=True)
    critic_warmup_updates: int = knob(400, zero_ok=True)
    bc_weight: float = knob(1.0, zero_ok=True)


class SACBuilder(AlgorithmBuilder):
    """SAC/RLPD in a run: RLPD's symmetric sampling (``buffer.online_fraction`` of each batch
    from autonomous steps, the rest from operator steps: demonstrations and takeovers, the
    prior data as HIL-SERL stores it); fixed-length episodes (truncation is not
    termination); the robots' reward times ``reward_scale``."""

    name = "sac"
    learner_name = "sac_rlpd"
    display_name = "SAC/RLPD"
    options = SACOptions
    policy_kinds = ("gaussian",)  # cameras: policy.cameras
    default_policy_kind = "gaussian"
    needs_next_observation = True
    learns_from = "reward"
    learner_sampler = "mix"

    def build(self, policy: Any, config: dict[str, Any]) -> SACRLPD:
        if not isinstance(policy, GaussianPolicy):
            raise TypeError(f"SAC/RLPD trains a GaussianPolicy, got {type(policy).__name__}")
        return SACRLPD(policy, SACConfig(**config))

    def algorithm_config(self, options: Any, run: RunParams, spec: RunSpec) -> dict[str, Any]:
        assert isinstance(options, SACOptions)
        return {
            "lr": run.lr,
            "gamma": options.gamma,
            "hidden": spec.policy.hidden_sizes[0],
            "init_temperature": options.init_temperature,
            "target_entropy": options.target_entropy,
            "critic_warmup_updates": options.critic_warmup_updates,
            "bc_weight": options.bc_weight,
        }

    def sampler(
        self, options: Any, spec: RunSpec, offline: bool, shares: Mapping[str, float]
    ) -> Sampler | None:
        """RLPD's symmetric sampling with HIL-SERL's prior data: autonomous steps against the
        operator steps (and the mounted rows, when offline data is mounted)."""
        prior = "both" if offline else "interventions"
        share = online_share(spec, offline, shares)
        return MixSampler(share, prior=prior, default=spec.buffer.online_fraction)

    def reward_scale(self, options: Any) -> float:
        assert isinstance(options, SACOptions)
        return options.reward_scale
