"""Adapters that let the fleet post-train LeRobot policies (ACT, Diffusion, SmolVLA, pi0).

:func:`make_lerobot_policy` builds one from its LeRobot config alone (random init, nothing from
a hub) or from a local ``save_pretrained`` directory; one that needs a hub download is refused
with :class:`LeRobotUnavailable`. :class:`LeRobotPolicyAdapter` puts the model behind
``cloud_learner.core.Policy`` with ``bc_loss``; batch conversion, normalisation and chunks are
described in ``docs/learner.md``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from cloud_learner.core import Batch, Weights
from cloud_learner.policies.base import describe_mismatch, load_weights_strict

LeRobotKind = Literal["act", "diffusion", "smolvla", "pi0"]
LEROBOT_KINDS: tuple[str, ...] = ("act", "diffusion", "smolvla", "pi0")


class LeRobotUnavailable(RuntimeError):
    """A LeRobot policy cannot be built here (a hub download or an extra package is needed)."""


def _classes(kind: str) -> tuple[Any, Any]:
    """(config class, policy class) of a LeRobot kind (imported lazily: heavy modules)."""
    if kind == "act":
        from lerobot.policies.act.configuration_act import ACTConfig
        from lerobot.policies.act.modeling_act import ACTPolicy

        return ACTConfig, ACTPolicy
    if kind == "diffusion":
        from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig
        from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy

        return DiffusionConfig, DiffusionPolicy
    if kind == "smolvla":
        from lerobot.policies.smolvla.configuration_smolvla import SmolVLAConfig
        from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

        return SmolVLAConfig, SmolVLAPolicy
    if kind == "pi0":
        from lerobot.policies.pi0.configuration_pi0 import PI0Config
        from lerobot.policies.pi0.modeling_pi0 import PI0Policy

        return PI0Config, PI0Policy
    raise ValueError(f"unknown LeRobot policy kind {kind!r}; use {', '.join(LEROBOT_KINDS)}")


def _features(
    state_dim: int, action_dim: int, image_keys: list[str], image_shape: tuple[int, int]
) -> tuple[dict[str, Any], dict[str, Any]]:
    from lerobot.configs.types import FeatureType, PolicyFeature

    inputs: dict[str, Any] = {"observation.state": PolicyFeature(FeatureType.STATE, (state_dim,))}
    for key in image_keys:
        inputs[key] = PolicyFeature(FeatureType.VISUAL, (3, *image_shape))
    outputs = {"action": PolicyFeature(FeatureType.ACTION, (action_dim,))}
    return inputs, outputs


# Our defaults for building from scratch (per kind), under the caller's overrides.
_DEFAULTS: dict[str, dict[str, Any]] = {
    "act": {"pretrained_backbone_weights": None, "n_action_steps": 1},
    "diffusion": {
        "pretrained_backbone_weights": None,
        "n_obs_steps": 1,
        "horizon": 16,
        "n_action_steps": 8,
    },
    "smolvla": {"load_vlm_weights": False},
    "pi0": {},
}


def make_lerobot_policy(
    kind: LeRobotKind,
    state_dim: int,
    action_dim: int,
    image_keys: list[str],
    image_shape: tuple[int, int] = (96, 96),
    *,
    pretrained_path: str | Path | None = None,
    **overrides: Any,
) -> LeRobotPolicyAdapter:
    """Build a LeRobot policy of ``kind`` behind the adapter.

    Args:
        kind: ``act``, ``diffusion``, ``smolvla`` or ``pi0``.
        state_dim / action_dim: D of ``observation.state``, A of ``action``.
        image_keys: cameras (``observation.images.<cam>``), each ``image_shape`` (H, W).
        pretrained_path: a local LeRobot ``pretrained_model`` directory: its config (with
            ``overrides`` applied) and weights; its input and output features must be these.
        overrides: LeRobot config fields (e.g. ``chunk_size=10``, ``dim_model=64``).

    Raises:
        LeRobotUnavailable: the config needs hub files (offline) or a missing extra package;
            the message says which and how to get it.
        ValueError: an unknown kind or config field; a pretrained directory that is missing,
            whose features differ from the robots' (each named) or whose tensors do not fit
            its config (each named with both shapes).
    """
    config_cls, policy_cls = _imported(kind)
    inputs, outputs = _features(state_dim, action_dim, image_keys, image_shape)
    try:
        if pretrained_path is None:
            cfg = config_cls(
                **{
                    **_DEFAULTS[kind],
                    "input_features": inputs,
                    "output_features": outputs,
                    "device": "cpu",
                    **overrides,
                }
            )
            return LeRobotPolicyAdapter(policy_cls(cfg), kind)
        return _from_pretrained(kind, Path(pretrained_path), inputs, outputs, overrides)
    except TypeError as exc:  # a dataclass field the config does not have
        raise ValueError(f"LeRobot {kind} config: {exc}") from None
    except OSError as exc:  # huggingface_hub's offline / not-cached errors are OSErrors
        raise LeRobotUnavailable(
            f"LeRobot {kind} cannot be built offline: its config loads files from the "
            f"Hugging Face hub and HF_HUB_OFFLINE is set ({type(exc).__name__}: {exc})"
        ) from exc


def _imported(kind: str) -> tuple[Any, Any]:
    try:
        return _classes(kind)
    except ImportError as exc:
        raise LeRobotUnavailable(
            f"LeRobot {kind} cannot be built: {exc} (an optional dependency of lerobot is not "
            "installed in this environment)"
        ) from exc


def _from_pretrained(
    kind: str,
    path: Path,
    inputs: dict[str, Any],
    outputs: dict[str, Any],
    overrides: Mapping[str, Any],
) -> LeRobotPolicyAdapter:
    """A policy from a local ``pretrained_model`` directory (see :func:`make_lerobot_policy`)."""
    import dataclasses

    from lerobot.configs.policies import PreTrainedConfig
    from safetensors.torch import load_file

    config_cls, policy_cls = _imported(kind)
    if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
        raise ValueError(
            f"{path} is not a LeRobot pretrained_model directory (needs config.json and "
            "model.safetensors, as LeRobot's save_pretrained writes them)"
        )
    cfg = PreTrainedConfig.from_pretrained(path)
    if not isinstance(cfg, config_cls):
        raise ValueError(f"{path} holds a {cfg.type} policy, not {kind}")
    problems = _feature_mismatch(cfg.input_features, inputs, "input") + _feature_mismatch(
        cfg.output_features, outputs, "output"
    )
    if problems:
        raise ValueError(f"{path} does not fit the run's robots: " + "; ".join(problems))
    cfg = dataclasses.replace(cfg, device="cpu", **overrides)
    adapter = LeRobotPolicyAdapter(policy_cls(cfg), kind)
    tensors = {f"policy.{k}": v for k, v in load_file(str(path / "model.safetensors")).items()}
    tensors = {
        **{k: v for k, v in adapter.state_dict().items() if k.startswith("norm_")},
        **tensors,
    }
    mismatch = describe_mismatch(adapter.state_dict(), tensors, expected_as="config wants")
    if mismatch:
        raise ValueError(
            f"{path}/model.safetensors does not fit its config: " + "; ".join(mismatch)
        )
    adapter.load_state_dict(tensors, strict=True)
    adapter.load_normalizer_stats(path)
    return adapter


def _feature_mismatch(saved: Mapping[str, Any], run: Mapping[str, Any], side: str) -> list[str]:
    out = []
    for key in sorted(set(saved) | set(run)):
        if key not in run:
            out.append(f"{side} {key}: in the checkpoint, not on the robots")
        elif key not in saved:
            out.append(f"{side} {key}: on the robots, not in the checkpoint")
        elif tuple(saved[key].shape) != tuple(run[key].shape):
            out.append(
                f"{side} {key}: checkpoint shape {tuple(saved[key].shape)}, robots "
                f"{tuple(run[key].shape)}"
            )
    return out


def lerobot_from_card(data: Mapping[str, Any]) -> LeRobotPolicyAdapter:
    """The network a policy card's ``lerobot`` section describes (untrained: load the
    version's tensors into it). Raises ValueError naming an unreadable section."""
    import draccus

    kind = data.get("kind")
    if kind not in LEROBOT_KINDS:
        raise ValueError(f"policy card lerobot.kind {kind!r} is unknown ({LEROBOT_KINDS})")
    config_cls, policy_cls = _imported(str(kind))
    try:
        cfg = draccus.decode(config_cls, dict(data.get("config") or {}))
    except Exception as exc:  # draccus raises its own parsing errors
        raise ValueError(f"policy card lerobot.config is not a {kind} config: {exc}") from None
    cfg.device = "cpu"
    return LeRobotPolicyAdapter(policy_cls(cfg), str(kind))


class LeRobotPolicyAdapter(nn.Module):
    """A LeRobot ``PreTrainedPolicy`` behind robofleet's Policy seam (see module docstring).

    Attributes:
        chunk_size: T of the ``action_chunk`` it trains on (ACT's ``chunk_size``,
            Diffusion's ``horizon``).
        image_keys: its cameras; ``state_dim`` / ``action_dim``: D and A.
    """

    per_row_loss = False
    policy: Any  # lerobot.policies.pretrained.PreTrainedPolicy (untyped here)

    def __init__(self, policy: Any, kind: str) -> None:
        super().__init__()
        self.policy = policy
        self.kind = kind
        cfg = policy.config
        self.chunk_size = int(cfg.horizon if kind == "diffusion" else cfg.chunk_size)
        self.image_keys = [k for k in cfg.input_features if ".images." in k]
        self.state_dim = int(cfg.input_features["observation.state"].shape[0])
        self.action_dim = int(cfg.output_features["action"].shape[0])
        # Buffers: saved with the weights, so robots normalise exactly as the learner did.
        self.register_buffer("norm_state_mean", torch.zeros(self.state_dim))
        self.register_buffer("norm_state_std", torch.ones(self.state_dim))
        self.register_buffer("norm_action_mean", torch.zeros(self.action_dim))
        self.register_buffer("norm_action_std", torch.ones(self.action_dim))

    # -- normalisation --------------------------------------------------------------------

    def set_state_normalization(
        self, states: torch.Tensor | np.ndarray, min_std: float = 1e-2
    ) -> None:
        """MEAN_STD of ``observation.state`` from ``states`` (N, D); stds floored at
        ``min_std``."""
        _fit(self.norm_state_mean, self.norm_state_std, states, min_std)

    def set_action_normalization(
        self, actions: torch.Tensor | np.ndarray, min_std: float = 1e-2
    ) -> None:
        """MEAN_STD of ``action`` from ``actions`` (N, A); stds floored at ``min_std``."""
        _fit(self.norm_action_mean, self.norm_action_std, actions, min_std)

    def load_normalizer_stats(self, path: Path) -> bool:
        """Read ``observation.state`` / ``action`` mean and std from a LeRobot pretrained
        directory's normaliser processor state, when it has one; True when read."""
        from safetensors.torch import load_file

        files = sorted(path.glob("policy_preprocessor*normalizer_processor.safetensors"))
        if not files:
            return False
        stats = load_file(str(files[0]))
        pairs: dict[str, Any] = {
            "observation.state.mean": self.norm_state_mean,
            "observation.state.std": self.norm_state_std,
            "action.mean": self.norm_action_mean,
            "action.std": self.norm_action_std,
        }
        found = False
        with torch.no_grad():
            for key, buf in pairs.items():
                value = stats.get(key)
                if value is not None and tuple(value.shape) == tuple(buf.shape):
                    buf.copy_(value)
                    found = True
        return found

    def _norm(self, x: torch.Tensor, mean: Any, std: Any) -> torch.Tensor:
        return (x.float() - mean) / std

    # -- batches --------------------------------------------------------------------------

    def _observations(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        state = self._norm(batch["observation.state"], self.norm_state_mean, self.norm_state_std)
        out: dict[str, torch.Tensor] = {"observation.state": state}
        for key in self.image_keys:
            if key not in batch:
                raise KeyError(
                    f"{self.kind} policy needs camera {key!r}; batch has {sorted(batch)}"
                )
            img = batch[key]
            if img.dtype != torch.uint8 or img.ndim != 4 or img.shape[-1] != 3:
                raise ValueError(f"{key} must be (B, H, W, 3) uint8, got {tuple(img.shape)}")
            out[key] = img.permute(0, 3, 1, 2).float() / 255.0
        if self.kind == "diffusion":
            out = {k: v.unsqueeze(1) for k, v in out.items()}  # (B, n_obs_steps=1, ...)
        return out

    def bc_loss(self, batch: Batch, indicator: torch.Tensor | None = None) -> torch.Tensor:
        """LeRobot's own training loss on the batch (a scalar: the batch mean), on
        normalised actions."""
        if indicator is not None:
            raise ValueError("LeRobot policies have no improvement-indicator input (RECAP)")
        if "action_chunk" not in batch:
            raise KeyError(
                f"{self.kind} trains on 'action_chunk' (B, T, A); batch has {sorted(batch)}"
            )
        chunk = batch["action_chunk"].float()
        if chunk.shape[1] != self.chunk_size:
            raise ValueError(
                f"action_chunk has T={chunk.shape[1]}, the {self.kind} config wants "
                f"{self.chunk_size}"
            )
        lb = self._observations(batch)
        lb["action"] = self._norm(chunk, self.norm_action_mean, self.norm_action_std)
        pad = batch.get("action_chunk_is_pad")
        lb["action_is_pad"] = (
            torch.zeros(chunk.shape[:2], dtype=torch.bool, device=chunk.device)
            if pad is None
            else pad.bool()
        )
        loss, _ = self.policy.forward(lb)
        result: torch.Tensor = loss
        return result

    @torch.no_grad()
    def act(self, observation: Mapping[str, np.ndarray], task: int = 0) -> np.ndarray:
        """The predicted chunk (T, A) float32 for one observation (task unused)."""
        batch = {
            k: torch.as_tensor(np.asarray(v)).unsqueeze(0)
            for k, v in observation.items()
            if k == "observation.state" or k.startswith("observation.images.")
        }
        was_training = self.training
        self.eval()
        try:
            obs = self._observations(batch)
            if self.kind == "diffusion":
                chunk = self.policy.diffusion.generate_actions(
                    {
                        **obs,
                        "observation.images": torch.stack(
                            [obs[k] for k in self.image_keys], dim=-4
                        ),
                    }
                    if self.image_keys
                    else obs
                )
            else:
                chunk = self.policy.predict_action_chunk(obs)
        finally:
            self.train(was_training)
        actions = chunk[0].float() * self.norm_action_std + self.norm_action_mean
        result: np.ndarray = actions.cpu().numpy().astype(np.float32)
        return result

    # -- weights and card -----------------------------------------------------------------

    def get_weights(self) -> Weights:
        return {k: v.detach().cpu().contiguous().clone() for k, v in self.state_dict().items()}

    def set_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        load_weights_strict(self, weights)

    def card_data(self) -> dict[str, Any]:
        """``{"kind", "config"}``: what a robot needs to build this network
        (:func:`lerobot_from_card`); the config draccus-encoded, JSON-ready."""
        import draccus

        config = json.loads(json.dumps(draccus.encode(self.policy.config)))
        return {"kind": self.kind, "config": config}


def _fit(mean: Any, std: Any, values: torch.Tensor | np.ndarray, min_std: float) -> None:
    x = torch.as_tensor(np.asarray(values), dtype=torch.float32).reshape(-1, mean.shape[0])
    with torch.no_grad():
        mean.copy_(x.mean(0))
        std.copy_(x.std(0, unbiased=False).clamp_min(min_std))
