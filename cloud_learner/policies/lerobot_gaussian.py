"""LeRobot's HIL-SERL actor (``lerobot.policies.gaussian_actor``) behind robofleet's Policy seam.

The network is LeRobot's own ``GaussianActorPolicy``, built from a ``GaussianActorConfig``
made of the run's features (:func:`gaussian_actor_config`), so the tensors a version carries
are, key for key and shape for shape, the ones LeRobot's actor loads.

Weights travel flat: the dict LeRobot's ``SACAlgorithm.get_weights`` returns
(``{"policy": actor_state_dict, "discrete_critic": ...}``) with each part's keys prefixed
by ``<part>.`` (``policy.encoder.state_encoder.0.weight``); :func:`unflatten_parts` restores
the nesting LeRobot's ``load_weights`` takes. Observations are normalised as LeRobot's actor
normalises them: its pre/post processors over the config's ``dataset_stats`` (MIN_MAX of
``observation.state`` and ``action`` from the bounds the run gives).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from cloud_learner.core import Weights

LEROBOT_TYPE = "gaussian_actor"  # LeRobot's registered policy type (the card's lerobot.kind)
STATE = "observation.state"
IMAGE_PREFIX = "observation.images."
# policy.config fields that are robofleet's, not GaussianActorConfig's: the normaliser's bounds.
BOUND_FIELDS = ("state_min", "state_max", "action_min", "action_max")
# GaussianActorConfig fields a run sets from its features and spec, never through policy.config.
_DERIVED = ("input_features", "output_features", "dataset_stats", "device", "actor_network_kwargs")


def config_field_names() -> set[str]:
    """Fields of LeRobot's ``GaussianActorConfig`` a run spec may set in ``policy.config``."""
    import dataclasses

    from lerobot.policies.gaussian_actor.configuration_gaussian_actor import GaussianActorConfig

    return {f.name for f in dataclasses.fields(GaussianActorConfig)} - set(_DERIVED)


def feature_errors(
    config: Mapping[str, Any],
    observation_features: Mapping[str, Mapping[str, Any]],
    cameras: Sequence[str],
    action_dim: int,
) -> dict[str, str]:
    """Why LeRobot's Gaussian actor cannot take these features, by ``policy.config.*`` or
    feature name (empty: it can).

    Args:
        config: the run spec's ``policy.config`` (LeRobot fields plus :data:`BOUND_FIELDS`).
        observation_features: the robots' observation features (LeRobot feature dicts).
        cameras: the camera features the policy sees (``observation.images.<name>``).
        action_dim: A of the robots' ``action`` (continuous dimensions, plus one discrete
            gripper dimension when ``num_discrete_actions`` is set).
    """
    errors: dict[str, str] = {}
    known = config_field_names()
    for key in sorted(set(config) - known - set(BOUND_FIELDS)):
        errors[f"policy.config.{key}"] = (
            f"not a field of LeRobot's GaussianActorConfig (settable: {', '.join(sorted(known))}"
            f", and the bounds {', '.join(BOUND_FIELDS)})"
        )
    state = observation_features.get(STATE)
    state_shape = tuple(state["shape"]) if state else ()
    if len(state_shape) != 1:
        errors[STATE] = f"LeRobot's Gaussian actor takes a vector state (D,), got {state_shape}"
    for key in cameras:
        shape = tuple(observation_features[key]["shape"])
        if len(shape) != 3 or shape[2] != 3:
            errors[key] = f"LeRobot's image encoder takes (H, W, 3) frames, got {shape}"
    continuous = action_dim - (1 if config.get("num_discrete_actions") is not None else 0)
    if continuous < 1:
        errors["action"] = f"{action_dim} dimension(s) leave no continuous action for the actor"
    sizes = {"state": state_shape[0] if len(state_shape) == 1 else None, "action": continuous}
    for name in BOUND_FIELDS:
        what = name.split("_")[0]
        value = config.get(name)
        where = f"policy.config.{name}"
        feature = STATE if what == "state" else "action"
        if value is None:
            errors[where] = (
                f"required: the {feature} bounds LeRobot's actor normalises with (its "
                f"dataset_stats {feature} {name.split('_')[1]}), one value per dimension"
            )
        elif not isinstance(value, list) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in value
        ):
            errors[where] = f"must be a list of numbers, got {value!r}"
        elif sizes[what] is not None and len(value) != sizes[what]:
            errors[where] = (
                f"{len(value)} values, {feature} has {sizes[what]} "
                f"{'continuous ' if what == 'action' else ''}dimension(s)"
            )
    for what in ("state", "action"):
        lo, hi = config.get(f"{what}_min"), config.get(f"{what}_max")
        if (
            f"policy.config.{what}_min" not in errors
            and f"policy.config.{what}_max" not in errors
            and any(a >= b for a, b in zip(lo, hi, strict=True))  # type: ignore[arg-type]
        ):
            errors[f"policy.config.{what}_max"] = f"must exceed {what}_min in every dimension"
    return errors


def gaussian_actor_config(
    state_dim: int,
    action_dim: int,
    image_keys: Sequence[str],
    image_shape: tuple[int, int],
    hidden_sizes: Sequence[int],
    config: Mapping[str, Any],
) -> Any:
    """LeRobot's ``GaussianActorConfig`` for these features (CPU; move with the policy).

    Args:
        state_dim / action_dim: D of ``observation.state``, A of the robots' ``action``.
        image_keys: cameras (``observation.images.<name>``), each ``image_shape`` (H, W).
        hidden_sizes: the actor's hidden widths (``actor_network_kwargs.hidden_dims``).
        config: ``policy.config``: GaussianActorConfig fields and the bounds
            (:data:`BOUND_FIELDS`) that become ``dataset_stats``.

    Raises:
        ValueError: what :func:`feature_errors` names, all at once.
    """
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.gaussian_actor.configuration_gaussian_actor import (
        ActorNetworkConfig,
        GaussianActorConfig,
    )

    features: dict[str, dict[str, tuple[int, ...]]] = {STATE: {"shape": (state_dim,)}}
    features.update({k: {"shape": (*image_shape, 3)} for k in image_keys})
    problems = feature_errors(config, features, image_keys, action_dim)
    if problems:
        raise ValueError(
            "LeRobot's Gaussian actor cannot take the run's features: "
            + "; ".join(f"{k}: {v}" for k, v in problems.items())
        )
    fields = {k: v for k, v in config.items() if k not in BOUND_FIELDS}
    continuous = action_dim - (1 if fields.get("num_discrete_actions") is not None else 0)
    inputs = {STATE: PolicyFeature(FeatureType.STATE, (state_dim,))}
    for key in image_keys:
        inputs[key] = PolicyFeature(FeatureType.VISUAL, (3, *image_shape))
    stats = {
        STATE: {"min": list(config["state_min"]), "max": list(config["state_max"])},
        "action": {"min": list(config["action_min"]), "max": list(config["action_max"])},
    }
    return GaussianActorConfig(
        input_features=inputs,
        output_features={"action": PolicyFeature(FeatureType.ACTION, (continuous,))},
        dataset_stats=stats,
        device="cpu",
        actor_network_kwargs=ActorNetworkConfig(hidden_dims=list(hidden_sizes)),
        **fields,
    )


def flatten_parts(parts: Mapping[str, Mapping[str, torch.Tensor]]) -> Weights:
    """``{"policy": {k: t}, ...}`` -> ``{"policy.k": t, ...}`` (CPU, contiguous copies)."""
    return {
        f"{part}.{key}": t.detach().cpu().contiguous().clone()
        for part, tensors in parts.items()
        for key, t in tensors.items()
    }


def unflatten_parts(weights: Mapping[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """Inverse of :func:`flatten_parts` (the part is the key's text before its first dot).

    Raises:
        ValueError: a key without a part prefix, or no ``policy`` part.
    """
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in weights.items():
        part, dot, rest = key.partition(".")
        if not dot:
            raise ValueError(f"weight {key!r} has no part prefix (policy., discrete_critic.)")
        parts.setdefault(part, {})[rest] = tensor
    if "policy" not in parts:
        raise ValueError(f"weights hold no 'policy.' tensors; parts: {sorted(parts)}")
    return parts


def observation_batch(
    batch: Mapping[str, torch.Tensor], image_keys: Sequence[str], prefix: str = ""
) -> dict[str, torch.Tensor]:
    """LeRobot's observation dict of a robofleet batch: ``observation.state`` (B, D) float32
    and each camera (B, H, W, 3) uint8 as (B, 3, H, W) float32 in [0, 1] (what LeRobot's
    environment processors hand its actor). ``prefix`` ``next.`` reads the next observation."""
    out = {STATE: batch[prefix + STATE].float()}
    for key in image_keys:
        out[key] = batch[prefix + key].permute(0, 3, 1, 2).float() / 255.0
    return out


class LeRobotGaussianActor(nn.Module):
    """LeRobot's ``GaussianActorPolicy`` as a robofleet Policy (see module docstring).

    Attributes:
        policy: the LeRobot policy (actor, shared encoder, optional discrete critic).
        image_keys: its cameras; ``state_dim`` / ``action_dim``: D and the robots' A.
    """

    per_row_loss = False
    policy: Any  # lerobot.policies.gaussian_actor.GaussianActorPolicy (untyped package)

    def __init__(self, config: Any) -> None:
        super().__init__()
        from lerobot.policies.gaussian_actor.modeling_gaussian_actor import GaussianActorPolicy

        self.policy = GaussianActorPolicy(config)
        self.image_keys = [k for k in config.input_features if k.startswith(IMAGE_PREFIX)]
        self.state_dim = int(config.input_features[STATE].shape[0])
        discrete = config.num_discrete_actions is not None
        self.action_dim = int(config.output_features["action"].shape[0]) + int(discrete)
        self.chunk_size = 1
        self._processors: tuple[Any, Any] | None = None

    @property
    def config(self) -> Any:
        return self.policy.config

    def processors(self) -> tuple[Any, Any]:
        """LeRobot's (preprocessor, postprocessor) over the config's ``dataset_stats``,
        on the policy's device (built once)."""
        device = str(next(self.policy.parameters()).device)
        if self._processors is None or self.config.device != device:
            from lerobot.policies import make_pre_post_processors

            self.config.device = device
            self._processors = make_pre_post_processors(
                policy_cfg=self.config, dataset_stats=self.config.dataset_stats
            )
        return self._processors

    @torch.no_grad()
    def act(self, observation: Mapping[str, np.ndarray], task: int = 0) -> np.ndarray:
        """One observation (no batch dimension) -> action (A,) float32, as LeRobot's actor
        computes it: normalise, ``select_action`` (a sample), unnormalise the continuous part
        (a discrete gripper choice is appended as is). ``task`` is unused."""
        if STATE not in observation:
            raise KeyError(f"observation needs {STATE!r}; got {sorted(observation)}")
        batch = {k: torch.as_tensor(np.asarray(observation[k]))[None] for k in (STATE,)}
        for key in self.image_keys:
            if key not in observation:
                raise KeyError(
                    f"policy needs camera {key!r}; observation has {sorted(observation)}"
                )
            batch[key] = torch.as_tensor(np.asarray(observation[key]))[None]
        pre, post = self.processors()
        device = next(self.policy.parameters()).device
        obs = observation_batch({k: v.to(device) for k, v in batch.items()}, self.image_keys)
        was_training = self.training
        self.eval()
        try:
            action = self.policy.select_action(batch=pre.process_observation(obs))
        finally:
            self.train(was_training)
        if self.config.num_discrete_actions is not None:
            cont = post.process_action(action[..., :-1])
            action = torch.cat([cont, action[..., -1:].to(cont)], dim=-1)
        else:
            action = post.process_action(action)
        result: np.ndarray = action[0].cpu().numpy().astype(np.float32)
        return result

    def lerobot_parts(self) -> dict[str, dict[str, torch.Tensor]]:
        """What LeRobot's actor loads: ``{"policy": actor state dict}`` and, with a discrete
        gripper, ``"discrete_critic"`` (``SACAlgorithm.get_weights``' layout)."""
        parts = {"policy": self.policy.actor.state_dict()}
        if self.policy.discrete_critic is not None:
            parts["discrete_critic"] = self.policy.discrete_critic.state_dict()
        return parts

    def get_weights(self) -> Weights:
        """:meth:`lerobot_parts`, flat (:func:`flatten_parts`)."""
        return flatten_parts(self.lerobot_parts())

    def set_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Load :meth:`get_weights`' form. Raises ValueError naming missing, unexpected or
        mis-shaped keys (each with its part prefix)."""
        from cloud_learner.policies.base import describe_mismatch

        parts = unflatten_parts(weights)
        own = self.lerobot_parts()
        problems = describe_mismatch(flatten_parts(own), weights)
        if problems:
            raise ValueError("weights do not fit this LeRobot actor: " + "; ".join(problems))
        self.policy.actor.load_state_dict(parts["policy"], strict=True)
        if "discrete_critic" in own:
            self.policy.discrete_critic.load_state_dict(parts["discrete_critic"], strict=True)

    def card_data(self) -> dict[str, Any]:
        """``{"kind": "gaussian_actor", "config": {...}}``: LeRobot's config, draccus-encoded
        (JSON-ready): what a robot builds the same network from (:func:`actor_from_card`)."""
        import draccus

        return {"kind": LEROBOT_TYPE, "config": json.loads(json.dumps(draccus.encode(self.config)))}


def config_from_card(data: Mapping[str, Any]) -> Any:
    """The ``GaussianActorConfig`` a card's ``lerobot`` section holds (device: CPU).
    Raises ValueError naming an unreadable section."""
    import draccus
    from lerobot.policies.gaussian_actor.configuration_gaussian_actor import GaussianActorConfig

    if data.get("kind") != LEROBOT_TYPE:
        raise ValueError(f"policy card lerobot.kind is {data.get('kind')!r}, not {LEROBOT_TYPE}")
    try:
        cfg = draccus.decode(GaussianActorConfig, dict(data.get("config") or {}))
    except Exception as exc:  # draccus raises its own parsing errors
        raise ValueError(
            f"policy card lerobot.config is not a {LEROBOT_TYPE} config: {exc}"
        ) from None
    cfg.device = "cpu"
    return cfg


def actor_from_card(data: Mapping[str, Any]) -> LeRobotGaussianActor:
    """The untrained network a card's ``lerobot`` section describes (load a version into it)."""
    return LeRobotGaussianActor(config_from_card(data))
