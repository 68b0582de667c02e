"""Adapters that let the fleet post-train LeRobot policies (ACT, Diffusion, SmolVLA, pi0).

:func:`make_lerobot_policy` builds a policy from its LeRobot config alone: no hub download,
randomly initialised (vision backbones with ``pretrained_backbone_weights=None``). A config
that needs something from the hub (SmolVLA's VLM config and weights, pi0's PaliGemma) is
refused offline with :class:`LeRobotUnavailable` naming what was missing and why.

:class:`LeRobotPolicyAdapter` puts the LeRobot model behind :class:`cloud_learner.core.Policy`
and gives it ``bc_loss`` so HG-DAgger (and RECAP without indicator) can train it:

* batch conversion: ``observation.images.<cam>`` (B, H, W, 3) uint8 -> (B, 3, H, W) float in
  [0, 1]; ``action_chunk`` (B, T, A) -> LeRobot's ``action`` with ``action_is_pad`` all False
  (or ``action_chunk_is_pad`` when the batch has it); observations gain the time axis when a
  config wants ``n_obs_steps`` = 1 stacked.
* LeRobot's losses are batch means (no per-row reduction for ACT and Diffusion), so
  ``per_row_loss`` is False and HG-DAgger trains on the labelled rows of each batch.
* normalisation: LeRobot 0.6 normalises in its processor pipeline, outside the model; the
  adapter feeds raw values, so give it normalised data (or wrap a processor) for real runs.
* ``act`` returns the whole predicted chunk (T, A) (``predict_action_chunk``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from cloud_learner.core import Batch, Weights
from cloud_learner.policies.base import load_weights_strict

LeRobotKind = Literal["act", "diffusion", "smolvla", "pi0"]


class LeRobotUnavailable(RuntimeError):
    """A LeRobot policy cannot be built here (a hub download or an extra package is needed)."""


def _features(
    state_dim: int, action_dim: int, image_keys: list[str], image_shape: tuple[int, int]
) -> tuple[dict[str, Any], dict[str, Any]]:
    from lerobot.configs.types import FeatureType, PolicyFeature

    inputs: dict[str, Any] = {"observation.state": PolicyFeature(FeatureType.STATE, (state_dim,))}
    for key in image_keys:
        inputs[key] = PolicyFeature(FeatureType.VISUAL, (3, *image_shape))
    outputs = {"action": PolicyFeature(FeatureType.ACTION, (action_dim,))}
    return inputs, outputs


def make_lerobot_policy(
    kind: LeRobotKind,
    state_dim: int,
    action_dim: int,
    image_keys: list[str],
    image_shape: tuple[int, int] = (96, 96),
    **overrides: Any,
) -> LeRobotPolicyAdapter:
    """Build a randomly initialised LeRobot policy of ``kind`` behind the adapter.

    ``overrides`` go to the LeRobot config (e.g. ``chunk_size=10``, ``dim_model=64``).

    Raises:
        LeRobotUnavailable: the config needs hub files (offline) or a missing extra package;
            the message says which and how to get it.
    """
    inputs, outputs = _features(state_dim, action_dim, image_keys, image_shape)
    common: dict[str, Any] = {"input_features": inputs, "output_features": outputs, "device": "cpu"}
    try:
        if kind == "act":
            from lerobot.policies.act.configuration_act import ACTConfig
            from lerobot.policies.act.modeling_act import ACTPolicy

            cfg = ACTConfig(
                **{"pretrained_backbone_weights": None, "n_action_steps": 1, **common, **overrides}
            )
            return LeRobotPolicyAdapter(ACTPolicy(cfg), kind, cfg.chunk_size, n_obs_steps=1)
        if kind == "diffusion":
            from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig
            from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy

            cfg_d = DiffusionConfig(
                **{
                    "pretrained_backbone_weights": None,
                    "n_obs_steps": 1,
                    "horizon": 16,
                    "n_action_steps": 8,
                    **common,
                    **overrides,
                }
            )
            return LeRobotPolicyAdapter(
                DiffusionPolicy(cfg_d), kind, cfg_d.horizon, n_obs_steps=cfg_d.n_obs_steps
            )
        if kind == "smolvla":
            from lerobot.policies.smolvla.configuration_smolvla import SmolVLAConfig
            from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

            cfg_s = SmolVLAConfig(**{"load_vlm_weights": False, **common, **overrides})
            return LeRobotPolicyAdapter(SmolVLAPolicy(cfg_s), kind, cfg_s.chunk_size, 1)
        if kind == "pi0":
            from lerobot.policies.pi0.configuration_pi0 import PI0Config
            from lerobot.policies.pi0.modeling_pi0 import PI0Policy

            cfg_p = PI0Config(**{**common, **overrides})
            return LeRobotPolicyAdapter(PI0Policy(cfg_p), kind, cfg_p.chunk_size, 1)
    except ImportError as exc:
        raise LeRobotUnavailable(
            f"LeRobot {kind} cannot be built: {exc} (an optional dependency of lerobot is not "
            "installed in this environment)"
        ) from exc
    except OSError as exc:  # huggingface_hub's offline / not-cached errors are OSErrors
        raise LeRobotUnavailable(
            f"LeRobot {kind} cannot be built offline: its config loads files from the "
            f"Hugging Face hub and HF_HUB_OFFLINE is set ({type(exc).__name__}: {exc})"
        ) from exc
    raise ValueError(f"unknown LeRobot policy kind {kind!r}; use act, diffusion, smolvla, pi0")


class LeRobotPolicyAdapter(nn.Module):
    """A LeRobot ``PreTrainedPolicy`` behind robofleet's Policy seam (see module docstring)."""

    per_row_loss = False
    policy: Any  # lerobot.policies.pretrained.PreTrainedPolicy (untyped here)

    def __init__(self, policy: Any, kind: str, chunk_size: int, n_obs_steps: int) -> None:
        super().__init__()
        self.policy = policy
        self.kind = kind
        self.chunk_size = chunk_size
        self.n_obs_steps = n_obs_steps
        self.image_keys = [k for k in policy.config.input_features if ".images." in k]

    def _observations(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {"observation.state": batch["observation.state"].float()}
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
        """LeRobot's own training loss on the batch (a scalar: the batch mean)."""
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
        lb["action"] = chunk
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
        """The predicted chunk (T, A) float32 for one observation (task unused: single-task)."""
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
        result: np.ndarray = chunk[0].cpu().numpy().astype(np.float32)
        return result

    def get_weights(self) -> Weights:
        return {k: v.detach().cpu().contiguous().clone() for k, v in self.state_dict().items()}

    def set_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        load_weights_strict(self, weights)
