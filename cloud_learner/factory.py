"""Build a policy and an algorithm from :class:`cloud_learner.config.LearnerSettings`."""

from __future__ import annotations

from typing import Any

import torch

from cloud_learner.algorithms import BY_LEARNER_NAME, RECAP, SACRLPD, HGDAgger, LeRobotSAC
from cloud_learner.config import LearnerSettings
from cloud_learner.policies import FlowMatchingPolicy, MLPPolicy, PolicySpec, TorchPolicy
from cloud_learner.policies.gaussian import GaussianPolicy
from cloud_learner.policies.lerobot_adapter import LeRobotPolicyAdapter, make_lerobot_policy
from cloud_learner.policies.lerobot_gaussian import LeRobotGaussianActor, gaussian_actor_config

AlgorithmT = HGDAgger | RECAP | SACRLPD | LeRobotSAC


def resolve_device(name: str) -> torch.device:
    """'auto' -> CUDA when present, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def policy_spec(settings: LearnerSettings) -> PolicySpec:
    p = settings.policy
    return PolicySpec(
        state_dim=p.state_dim,
        action_dim=p.action_dim,
        num_tasks=p.num_tasks,
        chunk_size=p.chunk_size,
        image_keys=list(p.image_keys),
        image_shape=p.image_shape,
        hidden=p.hidden,
        depth=p.depth,
        hidden_sizes=list(p.hidden_sizes),
        task_conditioning=p.task_conditioning,
        task_dim=p.task_dim,
        text_embedding_dim=p.text_embedding_dim,
        indicator=BY_LEARNER_NAME[settings.algorithm].indicator,
    )


def build_policy(
    settings: LearnerSettings,
) -> TorchPolicy | LeRobotPolicyAdapter | LeRobotGaussianActor:
    """The policy the settings name (``policy.kind``; SAC always trains its Gaussian actor).

    Raises:
        ValueError: a LeRobot policy whose config or pretrained directory does not fit;
            features LeRobot's Gaussian actor cannot take (each named).
        cloud_learner.policies.lerobot_adapter.LeRobotUnavailable: a LeRobot policy that
            needs the hub or a package this environment lacks.
    """
    spec = policy_spec(settings)
    kind = BY_LEARNER_NAME[settings.algorithm].policy_kind
    kind = kind if kind == "gaussian" else settings.policy.kind  # mlp/flow/lerobot: the settings'
    if kind == "gaussian":
        return GaussianPolicy(spec)
    if kind == "flow":
        return FlowMatchingPolicy(spec)
    if kind == "lerobot_gaussian":
        p = settings.policy
        config = gaussian_actor_config(
            p.state_dim,
            p.action_dim,
            list(p.image_keys),
            p.image_shape,
            list(p.hidden_sizes) or [p.hidden] * p.depth,
            p.lerobot_config,
        )
        return LeRobotGaussianActor(config)
    if kind == "lerobot":
        p = settings.policy
        if p.lerobot_kind is None:
            raise ValueError("learner.policy.kind lerobot needs policy.lerobot_kind")
        return make_lerobot_policy(
            p.lerobot_kind,
            p.state_dim,
            p.action_dim,
            list(p.image_keys),
            p.image_shape,
            pretrained_path=p.pretrained_path,
            **p.lerobot_config,
        )
    return MLPPolicy(spec)


def build_algorithm(settings: LearnerSettings, device: torch.device) -> AlgorithmT:
    """Policy + algorithm on ``device``; unknown hyper-parameters raise ValueError by name."""
    torch.manual_seed(settings.seed)
    policy = build_policy(settings).to(device)
    try:
        algorithm: AlgorithmT = BY_LEARNER_NAME[settings.algorithm].build(
            policy, dict(settings.algorithm_config)
        )
        return algorithm
    except TypeError as exc:
        raise ValueError(f"learner.algorithm_config for {settings.algorithm}: {exc}") from None


def model_config(settings: LearnerSettings) -> dict[str, Any]:
    """The part of the settings a checkpoint must agree with to be resumed."""
    return {
        "algorithm": settings.algorithm,
        "algorithm_config": dict(settings.algorithm_config),
        "policy": settings.policy.model_dump(mode="json"),
    }
