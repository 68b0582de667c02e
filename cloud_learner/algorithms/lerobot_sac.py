"""LeRobot's own SAC (``lerobot.rl.algorithms.sac``, HIL-SERL's learner) on robofleet's buffer.

Nothing of SAC is written here: each update hands one robofleet batch, turned into LeRobot's
RL batch (:func:`lerobot_batch`) and normalised by LeRobot's preprocessor as its learner does
(``lerobot.rl.trainer.preprocess_rl_batch``: observations only), to
``SACAlgorithm.update`` (critics, actor, temperature, target networks). The policy is
LeRobot's ``GaussianActorPolicy`` (:mod:`cloud_learner.policies.lerobot_gaussian`), and the
published weights are ``SACAlgorithm.get_weights()`` flattened: what LeRobot's actor loads
(:mod:`cloud_learner.lerobot_parameters` turns a version into its ``StreamParameters`` bytes).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from buffer.sampling.samplers import MixSampler, Sampler
from cloud_learner.algorithms.builder import AlgorithmBuilder, online_share
from cloud_learner.algorithms.common import AlgorithmBase
from cloud_learner.core import Batch, Metrics, Weights
from cloud_learner.policies.lerobot_gaussian import (
    LeRobotGaussianActor,
    flatten_parts,
    observation_batch,
)
from foundation.runspec import RunParams, RunSpec, knob


@dataclass
class LeRobotSACConfig:
    """Fields of LeRobot's ``SACAlgorithmConfig`` a run sets (JSON-able; LeRobot's defaults
    for the rest). ``critic_hidden``: its critics' hidden widths (``critic_network_kwargs``)."""

    actor_lr: float = 3e-4
    critic_lr: float = 3e-4
    temperature_lr: float = 3e-4
    discount: float = 0.99
    critic_target_update_weight: float = 0.005
    num_critics: int = 2
    temperature_init: float = 1.0
    grad_clip_norm: float = 40.0
    policy_update_freq: int = 1
    critic_hidden: tuple[int, ...] | list[int] = (256, 256)


def lerobot_batch(batch: Batch, image_keys: list[str]) -> dict[str, Any]:
    """LeRobot's RL batch of a robofleet batch: ``state`` / ``next_state`` (observation dicts,
    :func:`~cloud_learner.policies.lerobot_gaussian.observation_batch`), ``action`` (B, A),
    ``reward`` (B,), ``done`` (B,) = ``terminated`` (truncation is not termination, as
    LeRobot's actor sends them), ``truncated`` (B,) and ``complementary_info``
    ``{"is_intervention": (B,)}``, all float32.

    Raises:
        KeyError: the batch lacks a key SAC reads (``next.observation.*``, ``reward``, ...).
    """
    return {
        "state": observation_batch(batch, image_keys),
        "next_state": observation_batch(batch, image_keys, prefix="next."),
        "action": batch["action"].float(),
        "reward": batch["reward"].float(),
        "done": batch["terminated"].float(),
        "truncated": batch["truncated"].float()
        if "truncated" in batch
        else torch.zeros_like(batch["reward"]),
        "complementary_info": {"is_intervention": batch["is_intervention"].float()},
    }


class LeRobotSAC(AlgorithmBase):
    """LeRobot's ``SACAlgorithm`` around a :class:`LeRobotGaussianActor` (module docstring)."""

    name = "lerobot_sac"

    def __init__(self, policy: LeRobotGaussianActor, config: LeRobotSACConfig | None = None):
        from lerobot.policies.gaussian_actor.configuration_gaussian_actor import (
            CriticNetworkConfig,
        )
        from lerobot.rl.algorithms.factory import make_algorithm
        from lerobot.rl.algorithms.sac.configuration_sac import SACAlgorithmConfig

        self.policy = policy
        self.config = cfg = config or LeRobotSACConfig()
        fields = {k: v for k, v in vars(cfg).items() if k != "critic_hidden"}
        lerobot_cfg = SACAlgorithmConfig(
            **fields,
            critic_network_kwargs=CriticNetworkConfig(hidden_dims=list(cfg.critic_hidden)),
            policy_config=policy.config,
        )
        policy.config.device = str(next(policy.parameters()).device)
        self.sac: Any = make_algorithm(cfg=lerobot_cfg, policy=policy.policy)
        self.optimizers: dict[str, torch.optim.Optimizer] = self.sac.make_optimizers_and_scheduler()
        self.updates = 0

    def update(self, batch: Batch) -> Metrics:
        """One ``SACAlgorithm.update`` on ``batch`` (robofleet keys, ``cloud_learner.core``);
        returns LeRobot's training stats (``loss_critic``, ``loss_actor``,
        ``loss_temperature``, grad norms, ``temperature``) and ``loss`` = ``loss_critic``."""
        from lerobot.rl.trainer import preprocess_rl_batch

        pre, _ = self.policy.processors()
        rl_batch = preprocess_rl_batch(pre, lerobot_batch(batch, self.policy.image_keys))
        stats = self.sac.update(iter([rl_batch]))
        self.updates += 1
        metrics: Metrics = {k: float(v) for k, v in stats.to_log_dict().items()}
        metrics["loss"] = metrics["loss_critic"]
        return metrics

    def get_weights(self) -> Weights:
        """``SACAlgorithm.get_weights()`` flattened: ``policy.<actor key>`` (and
        ``discrete_critic.<key>``), CPU tensors."""
        weights: Weights = flatten_parts(self.sac.get_weights())
        return weights

    def parts(self) -> dict[str, torch.nn.Module | torch.optim.Optimizer]:
        out: dict[str, torch.nn.Module | torch.optim.Optimizer] = {"policy": self.policy}
        out.update({f"optimizer_{name}": opt for name, opt in self.optimizers.items()})
        return out

    def extra_state(self) -> dict[str, Any]:
        """LeRobot's own algorithm state (critics, targets, ``log_alpha``; the shared encoder
        is the policy's) and its optimisation step."""
        sac_state = {k: v.detach().clone() for k, v in self.sac.state_dict().items()}
        return {"sac": sac_state, "optimization_step": int(self.sac.optimization_step)}

    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        self.sac.load_state_dict(dict(state["sac"]), device=self.sac._device)
        self.sac.optimization_step = int(state["optimization_step"])


@dataclass(frozen=True)
class LeRobotSACOptions:
    """LeRobot SAC's hyper-parameters in a run spec (LeRobot's defaults).

    Attributes:
        gamma: discount per control step (``discount``).
        temperature_init: initial entropy temperature.
        critic_lr / temperature_lr: their Adam rates (the actor's is ``lr``).
        tau: Polyak rate of the target critics (``critic_target_update_weight``).
        num_critics: critic ensemble size.
        grad_clip_norm: gradient clipping of every optimizer step.
        policy_update_freq: critic updates per actor and temperature update.
        reward_scale: multiplies the robots' reward.
    """

    gamma: float = knob(0.99, within=(lambda v: 0 < v <= 1, "(0, 1]"))
    temperature_init: float = knob(1.0)
    critic_lr: float = knob(3e-4)
    temperature_lr: float = knob(3e-4)
    tau: float = knob(0.005, within=(lambda v: 0 < v <= 1, "(0, 1]"))
    num_critics: int = knob(2)
    grad_clip_norm: float = knob(40.0)
    policy_update_freq: int = knob(1)
    reward_scale: float = knob(1.0)


class LeRobotSACBuilder(AlgorithmBuilder):
    """LeRobot's SAC in a run: HIL-SERL's sampling (half of each batch from autonomous steps,
    half from the operators' takeovers and mounted data, as LeRobot's learner mixes its online
    and intervention buffers), episodes that end at success, the robots' reward times
    ``reward_scale``. Its policy, ``lerobot-gaussian-actor``, is LeRobot's, so LeRobot's
    unmodified actor loads its versions."""

    name = "lerobot-sac"
    learner_name = "lerobot_sac"
    display_name = "LeRobot SAC (HIL-SERL)"
    options = LeRobotSACOptions
    terminate_on_success = True
    policy_kinds = ("lerobot-gaussian-actor",)
    default_policy_kind = "lerobot-gaussian-actor"
    needs_next_observation = True
    learns_from = "reward"
    learner_sampler = "mix"

    def build(self, policy: Any, config: dict[str, Any]) -> LeRobotSAC:
        if not isinstance(policy, LeRobotGaussianActor):
            raise TypeError(f"LeRobot SAC trains LeRobot's Gaussian actor, got {type(policy)}")
        return LeRobotSAC(policy, LeRobotSACConfig(**config))

    def algorithm_config(self, options: Any, run: RunParams, spec: RunSpec) -> dict[str, Any]:
        assert isinstance(options, LeRobotSACOptions)
        return {
            "actor_lr": run.lr,
            "critic_lr": options.critic_lr,
            "temperature_lr": options.temperature_lr,
            "discount": options.gamma,
            "critic_target_update_weight": options.tau,
            "num_critics": options.num_critics,
            "temperature_init": options.temperature_init,
            "grad_clip_norm": options.grad_clip_norm,
            "policy_update_freq": options.policy_update_freq,
            "critic_hidden": list(spec.policy.hidden_sizes),
        }

    def sampler(
        self, options: Any, spec: RunSpec, offline: bool, shares: Mapping[str, float]
    ) -> Sampler | None:
        prior = "both" if offline else "interventions"
        return MixSampler(
            online_share(spec, offline, shares), prior=prior, default=spec.buffer.online_fraction
        )

    def reward_scale(self, options: Any) -> float:
        assert isinstance(options, LeRobotSACOptions)
        return options.reward_scale
