"""A ``lerobot-sac`` run's version as what LeRobot's actor loads (the gateway's parameters out).

LeRobot's learner streams ``state_to_bytes(algorithm.get_weights())`` through
``StreamParameters``; its actor reads them with ``bytes_to_state_dict`` (``torch.load`` with
``weights_only=True``) and hands the dict to ``algorithm.load_weights``. A robofleet version
holds the same tensors flat (``policy.<key>``, ``discrete_critic.<key>``) beside its policy
card; :func:`lerobot_state_dicts` restores LeRobot's nesting and :func:`parameter_bytes`
encodes it with LeRobot's own ``state_to_bytes``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from cloud_learner.policies.lerobot_gaussian import (
    LEROBOT_TYPE,
    config_from_card,
    unflatten_parts,
)
from cloud_learner.policy_card import LEROBOT, PolicyCard, split_card


class NotALeRobotVersion(ValueError):
    """The version was not trained as LeRobot's Gaussian actor (another algorithm's policy)."""


def _card(weights: Mapping[str, Any]) -> tuple[PolicyCard, dict[str, Any]]:
    card, rest = split_card(weights)
    if card is None or card.kind != LEROBOT or (card.lerobot or {}).get("kind") != LEROBOT_TYPE:
        what = "no policy card" if card is None else f"a {card.algorithm} {card.kind} policy"
        raise NotALeRobotVersion(
            f"the version holds {what}, not LeRobot's {LEROBOT_TYPE} (train it with algorithm "
            "lerobot-sac for LeRobot's actors)"
        )
    return card, rest


def lerobot_state_dicts(weights: Mapping[str, Any]) -> dict[str, dict[str, torch.Tensor]]:
    """The dict LeRobot's ``algorithm.load_weights`` takes (``{"policy": actor_state_dict}``,
    plus ``"discrete_critic"`` with a discrete gripper) from a version's flat tensors (as
    ``comms.cloud.weight_file.WeightDirectory`` stores them, card included).

    Raises:
        NotALeRobotVersion: the version is not a ``lerobot-sac`` run's.
        cloud_learner.policy_card.PolicyCardError: an unreadable card.
        ValueError: tensors without a part prefix, or no ``policy.`` tensors.
    """
    _, rest = _card(weights)
    return unflatten_parts(rest)


def parameter_bytes(weights: Mapping[str, Any]) -> bytes:
    """The bytes LeRobot's ``StreamParameters`` carries for this version: LeRobot's
    ``state_to_bytes`` of :func:`lerobot_state_dicts`. Raises as that does."""
    from lerobot.transport.utils import state_to_bytes

    data: bytes = state_to_bytes(lerobot_state_dicts(weights))
    return data


def actor_config(weights: Mapping[str, Any]) -> Any:
    """The ``GaussianActorConfig`` the version was trained with (its card's): what a LeRobot
    actor's ``policy`` config must agree with (features, ``dataset_stats``, sizes).
    Raises NotALeRobotVersion or ValueError (an unreadable config)."""
    card, _ = _card(weights)
    assert card.lerobot is not None
    return config_from_card(card.lerobot)
