"""The policy card: what a published weight version *is*, shipped inside the version itself.

A robot that receives weights must build the right network to run them: a deterministic MLP
(HG-DAgger), an indicator-conditioned MLP acting on "positive" with classifier-free guidance
(RECAP), or a tanh-Gaussian actor that samples while training (SAC/RLPD). The learner puts a
card next to the tensors, so an edge agent or an evaluator needs no knowledge of the run spec.

Wire form: one extra tensor ``CARD_KEY`` (``_policy_card``), uint8 ``(N,)``, holding the UTF-8
JSON of the card. It travels through every weight path unchanged (safetensors files, comms'
chunked and delta-encoded versions, site relays): it is just another named tensor, it never
changes between versions of a run (so deltas skip it), and it is parsed with ``json``, never
unpickled. Card fields::

    {"format": 1,
     "algorithm": "hg_dagger" | "recap" | "sac_rlpd",
     "kind": "mlp" | "gaussian" | "flow" | "lerobot",   # the policy class
     "spec": {...PolicySpec...},              # shapes, cameras, sizes (PolicySpec.to_json)
     "guidance_weight": 1.0,                  # RECAP's CFG weight (inference on "positive")
     "lerobot": {"kind": "act", "config": {...}}}   # kind lerobot only: LeRobot's config
                                              # (kind gaussian_actor: LeRobot SAC's actor)

The normalisation statistics are tensors of every kind's weights (``state_mean``/``state_std``
of robofleet's policies, ``norm_*`` of the LeRobot adapter), so they travel with each version.

A version of a ``reward.source: classifier`` run also carries the reward classifier's tensors
(``cloud_learner.reward_classifier.PREFIX``): :func:`split_card`, through which every loader of
a version's policy goes (robots, the evaluator, starting weights from ``promoted.safetensors``),
leaves them out, and those of a ``help.risk: probe`` run's probe (``cloud_learner.help_probe``).

Weights without a card (published before cards existed) are HG-DAgger MLP weights: they load
into the caller's fallback MLP as before.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch

from cloud_learner.help_probe import strip as strip_probe
from cloud_learner.policies.base import INDICATOR_POSITIVE, PolicySpec, TorchPolicy
from cloud_learner.policies.flow import FlowMatchingPolicy
from cloud_learner.policies.gaussian import GaussianPolicy
from cloud_learner.policies.lerobot_adapter import LeRobotPolicyAdapter, lerobot_from_card
from cloud_learner.policies.lerobot_gaussian import (
    LEROBOT_TYPE,
    LeRobotGaussianActor,
    actor_from_card,
)
from cloud_learner.policies.mlp import MLPPolicy
from cloud_learner.reward_classifier import strip as strip_classifier

CARD_KEY = "_policy_card"
CARD_FORMAT = 1
KINDS: dict[str, type[TorchPolicy]] = {
    "mlp": MLPPolicy,
    "gaussian": GaussianPolicy,
    "flow": FlowMatchingPolicy,
}
LEROBOT = "lerobot"  # the card kind of LeRobot policies (cloud_learner.policies.lerobot_adapter)


class PolicyCardError(ValueError):
    """A card is unreadable, of an unknown format or kind, or does not fit the robot."""


@dataclass(frozen=True)
class PolicyCard:
    """What a weight version is; see the module docstring for the JSON form.

    Attributes:
        algorithm: the learner's algorithm (``hg_dagger``, ``recap``, ``sac_rlpd``).
        kind: policy class, a key of :data:`KINDS`.
        spec: the policy's shapes and sizes.
        guidance_weight: classifier-free guidance weight w on the "positive" indicator
            (RECAP; 1.0 = plain conditioning, ignored without an indicator).
        lerobot: kind ``lerobot`` only: ``{"kind": "act" | ..., "config": {...}}``
            (``LeRobotPolicyAdapter.card_data``).
    """

    algorithm: str
    kind: str
    spec: PolicySpec
    guidance_weight: float = 1.0
    lerobot: dict[str, Any] | None = None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PolicyCard) and self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash(json.dumps(self.to_json(), sort_keys=True))

    def to_json(self) -> dict[str, Any]:
        out = {
            "format": CARD_FORMAT,
            "algorithm": self.algorithm,
            "kind": self.kind,
            "spec": self.spec.to_json(),
            "guidance_weight": self.guidance_weight,
        }
        if self.lerobot is not None:
            out["lerobot"] = self.lerobot
        return out

    @property
    def chunk_size(self) -> int:
        """Actions per policy call on a robot (T; 1 = single actions)."""
        if self.lerobot is not None:
            cfg = self.lerobot.get("config") or {}
            if self.lerobot.get("kind") == "diffusion":
                return int(cfg.get("n_action_steps", 1))
            return int(cfg.get("chunk_size", 1))
        return int(self.spec.chunk_size)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PolicyCard:
        """Raises PolicyCardError naming the bad field."""
        if data.get("format") != CARD_FORMAT:
            raise PolicyCardError(
                f"policy card format {data.get('format')!r} is not supported (want {CARD_FORMAT})"
            )
        kind = data.get("kind")
        if kind not in KINDS and kind != LEROBOT:
            kinds = sorted([*KINDS, LEROBOT])
            raise PolicyCardError(f"policy card kind {kind!r} is unknown (known: {kinds})")
        raw = data.get("spec")
        if not isinstance(raw, Mapping):
            raise PolicyCardError("policy card has no 'spec' object")
        known = {f.name for f in fields(PolicySpec)}
        extra = sorted(set(raw) - known)
        if extra:
            raise PolicyCardError(f"policy card spec has unknown fields {extra}")
        try:
            spec = PolicySpec(**{**raw, "image_shape": tuple(raw.get("image_shape", (64, 64)))})
        except TypeError as exc:
            raise PolicyCardError(f"policy card spec: {exc}") from None
        weight = data.get("guidance_weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise PolicyCardError(f"policy card guidance_weight must be a number, got {weight!r}")
        lerobot = data.get("lerobot")
        if kind == LEROBOT and not isinstance(lerobot, Mapping):
            raise PolicyCardError("policy card of kind lerobot has no 'lerobot' object")
        section = dict(lerobot) if kind == LEROBOT and isinstance(lerobot, Mapping) else None
        return cls(str(data.get("algorithm", "")), str(kind), spec, float(weight), section)

    def to_tensor(self) -> torch.Tensor:
        """The card as the uint8 ``(N,)`` tensor stored under :data:`CARD_KEY`."""
        raw = json.dumps(self.to_json(), sort_keys=True).encode()
        return torch.from_numpy(np.frombuffer(raw, dtype=np.uint8).copy())

    def build(self) -> TorchPolicy | LeRobotPolicyAdapter | LeRobotGaussianActor:
        """A fresh policy of this card's kind and spec, set up for inference as the card says.

        Raises:
            PolicyCardError: a LeRobot section that does not describe a buildable policy.
        """
        if self.lerobot is not None:
            try:
                if self.lerobot.get("kind") == LEROBOT_TYPE:
                    return actor_from_card(self.lerobot)
                return lerobot_from_card(self.lerobot)
            except (ValueError, RuntimeError) as exc:
                raise PolicyCardError(str(exc)) from None
        policy = KINDS[self.kind](self.spec)
        if self.spec.indicator:
            policy.inference_indicator = INDICATOR_POSITIVE
            policy.guidance_weight = self.guidance_weight
        return policy


def card_for(algorithm: str, policy: Any) -> PolicyCard:
    """The card of ``policy`` trained by ``algorithm`` (what the learner publishes).

    Raises:
        PolicyCardError: the policy is none of :data:`KINDS` nor a LeRobot adapter.
    """
    if isinstance(policy, LeRobotGaussianActor):
        spec = PolicySpec(policy.state_dim, policy.action_dim, image_keys=list(policy.image_keys))
        return PolicyCard(algorithm, LEROBOT, spec, 1.0, policy.card_data())
    if isinstance(policy, LeRobotPolicyAdapter):
        spec = PolicySpec(
            policy.state_dim,
            policy.action_dim,
            chunk_size=policy.chunk_size,
            image_keys=list(policy.image_keys),
        )
        return PolicyCard(algorithm, LEROBOT, spec, 1.0, policy.card_data())
    kind = next((k for k, cls in KINDS.items() if type(policy) is cls), None)
    if kind is None or not isinstance(policy, TorchPolicy):
        raise PolicyCardError(
            f"{type(policy).__name__} has no policy card kind (known: {sorted(KINDS)})"
        )
    return PolicyCard(algorithm, kind, policy.spec, float(policy.guidance_weight))


def split_card(weights: Mapping[str, Any]) -> tuple[PolicyCard | None, dict[str, Any]]:
    """(card or None, the policy's weights: without the card and without a reward classifier's
    tensors nor a help probe's). Raises PolicyCardError on an unreadable card."""
    rest = {k: v for k, v in strip_probe(strip_classifier(weights)).items() if k != CARD_KEY}
    if CARD_KEY not in weights:
        return None, rest
    raw = weights[CARD_KEY]
    arr = raw.numpy() if isinstance(raw, torch.Tensor) else np.asarray(raw)
    if arr.dtype != np.uint8 or arr.ndim != 1:
        raise PolicyCardError(
            f"{CARD_KEY} must be a uint8 (N,) tensor, got {arr.dtype} {arr.shape}"
        )
    try:
        data = json.loads(arr.tobytes().decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PolicyCardError(f"{CARD_KEY} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise PolicyCardError(f"{CARD_KEY} must hold a JSON object")
    return PolicyCard.from_json(data), rest


def with_card(weights: Mapping[str, torch.Tensor], card: PolicyCard) -> dict[str, torch.Tensor]:
    """``weights`` plus the card tensor (what a publisher ships)."""
    return {**weights, CARD_KEY: card.to_tensor()}


class CardPublisher:
    """A :class:`foundation.contracts.WeightPublisher` that adds the card to every version.

    Forwards ``latest_version`` (and any other attribute) to the wrapped publisher.
    """

    def __init__(self, inner: Any, card: PolicyCard) -> None:
        self.inner = inner
        self.card = card

    def latest_version(self) -> int:
        return int(getattr(self.inner, "latest_version", lambda: 0)())

    def publish(self, version: int, weights: Mapping[str, torch.Tensor]) -> None:
        self.inner.publish(version, with_card(weights, self.card))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
