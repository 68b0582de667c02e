"""LeRobot policies behind the fleet's Policy seam: built offline from configs, trained by
HG-DAgger, weights shipped as raw tensors; hub-dependent configs refused with a clear message."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import load, save

from cloud_learner.algorithms import HGDAgger, HGDAggerConfig
from cloud_learner.core import Policy
from cloud_learner.policies.lerobot_adapter import LeRobotUnavailable, make_lerobot_policy

CAM = "observation.images.front"
SMALL = {
    "act": dict(
        chunk_size=4,
        dim_model=64,
        n_heads=2,
        dim_feedforward=128,
        n_encoder_layers=1,
        n_decoder_layers=1,
    ),
    "diffusion": dict(
        horizon=8,
        n_action_steps=4,
        down_dims=(32, 64),
        diffusion_step_embed_dim=32,
        num_train_timesteps=10,
        spatial_softmax_num_keypoints=8,
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["act", "diffusion"])
def test_lerobot_policy_trains_with_hg_dagger_and_ships_weights(kind: str) -> None:
    torch.manual_seed(0)
    policy = make_lerobot_policy(kind, 3, 2, [CAM], (64, 64), **SMALL[kind])  # type: ignore[arg-type]
    assert isinstance(policy, Policy)
    t = policy.chunk_size
    rng = np.random.default_rng(0)
    batch = {
        "observation.state": torch.randn(6, 3),
        CAM: torch.from_numpy(rng.integers(0, 255, (6, 64, 64, 3), dtype=np.uint8)),
        "action_chunk": torch.rand(6, t, 2) * 2 - 1,
        "is_intervention": torch.tensor([True, True, False, True, False, True]),
    }
    algo = HGDAgger(policy, HGDAggerConfig(lr=1e-3))
    before = {k: v.clone() for k, v in policy.get_weights().items()}
    metrics = algo.update(batch)
    assert np.isfinite(metrics["loss"]) and metrics["labelled_fraction"] == pytest.approx(4 / 6)
    after = policy.get_weights()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # it trained

    obs = {"observation.state": np.zeros(3, np.float32), CAM: np.zeros((64, 64, 3), np.uint8)}
    chunk = policy.act(obs)
    assert chunk.ndim == 2 and chunk.shape[1] == 2 and chunk.dtype == np.float32
    robot = make_lerobot_policy(kind, 3, 2, [CAM], (64, 64), **SMALL[kind])  # type: ignore[arg-type]
    robot.set_weights(load(save(after)))  # safetensors bytes, as comms ships them
    for key, value in robot.get_weights().items():
        assert torch.equal(value, after[key]), key
    with pytest.raises(KeyError, match="action_chunk"):
        policy.bc_loss({k: v for k, v in batch.items() if k != "action_chunk"})


def test_smolvla_is_refused_offline_with_a_clear_message() -> None:
    # SmolVLA's config names a VLM on the hub (HuggingFaceTB/SmolVLM2-500M-Video-Instruct);
    # even without its weights, the model's config and processor must be fetched from the hub.
    with pytest.raises(LeRobotUnavailable, match="smolvla cannot be built offline.*hub"):
        make_lerobot_policy("smolvla", 3, 2, [CAM], (64, 64))


def test_unknown_kind_is_named() -> None:
    with pytest.raises(ValueError, match="unknown LeRobot policy kind 'octo'"):
        make_lerobot_policy("octo", 3, 2, [CAM])  # type: ignore[arg-type]
