"""Starting weights: a published version (with its policy card), a robofleet checkpoint or a
LeRobot pretrained_model directory (saved with LeRobot's own save_pretrained) load into a new
run's policy; what does not fit is refused naming each tensor and the spec keys behind it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from cloud_learner.algorithms import HGDAgger
from cloud_learner.checkpoint import CheckpointManager, CheckpointState
from cloud_learner.init_weights import (
    InitialWeightsError,
    card_spec,
    load_into,
    read_initial,
)
from cloud_learner.policies import MLPPolicy, PolicySpec
from cloud_learner.policy_card import CardPublisher, card_for
from comms.cloud.weight_file import WeightDirectory

D, A = 5, 2


def mlp(*widths: int, seed: int = 0) -> MLPPolicy:
    torch.manual_seed(seed)
    return MLPPolicy(PolicySpec(D, A, num_tasks=2, hidden_sizes=list(widths)))


def publish(policy: MLPPolicy, directory: Path) -> Path:
    CardPublisher(WeightDirectory(directory), card_for("hg_dagger", policy)).publish(
        3, policy.get_weights()
    )
    return directory / "v00000003.safetensors"


def test_a_published_version_starts_a_run_with_the_same_weights(tmp_path: Path) -> None:
    before = mlp(32, 16, seed=1)
    before.set_state_normalization(np.random.default_rng(0).normal(3.0, 2.0, size=(100, D)))
    initial = read_initial(publish(before, tmp_path / "weights"))
    assert initial.card is not None and initial.card.kind == "mlp"
    after = mlp(32, 16, seed=2)
    load_into(after, initial, card_spec(card_for("hg_dagger", after)))
    for key, value in before.state_dict().items():
        assert torch.equal(after.state_dict()[key], value), key  # normalisation included


def test_other_hidden_sizes_are_refused_naming_tensors_and_the_key(tmp_path: Path) -> None:
    initial = read_initial(publish(mlp(32, 16), tmp_path / "weights"))
    other = mlp(64, 64)
    with pytest.raises(InitialWeightsError) as err:
        load_into(other, initial, card_spec(card_for("hg_dagger", other)))
    text = str(err.value)
    assert "head.0.weight: this run shape (64, 7)" in text and "(32, 7)" in text
    assert "policy.hidden_sizes: init has [32, 16], this run has [64, 64]" in text
    assert torch.equal(
        other.state_dict()["head.0.weight"], mlp(64, 64).state_dict()["head.0.weight"]
    )


def test_a_checkpoint_of_an_earlier_run_gives_its_policy(tmp_path: Path) -> None:
    policy = mlp(16, seed=5)
    algorithm = HGDAgger(policy)
    spec = {"algorithm": "hg-dagger", "policy": {"hidden_sizes": [16]}}
    CheckpointManager(tmp_path / "old-run").save(
        CheckpointState(7, 2, algorithm.state_dict(), {"x": 1}, spec=spec)
    )
    for path in (tmp_path / "old-run", tmp_path / "old-run" / "checkpoints"):
        initial = read_initial(path)
        fresh = mlp(16, seed=6)
        load_into(fresh, initial, spec)
        assert torch.equal(
            fresh.state_dict()["head.0.weight"], policy.state_dict()["head.0.weight"]
        )
    wider = mlp(24)
    with pytest.raises(InitialWeightsError, match=r"policy.hidden_sizes: init has \[16\]"):
        load_into(
            wider, read_initial(tmp_path / "old-run"), {**spec, "policy": {"hidden_sizes": [24]}}
        )


def test_what_is_not_weights_is_named(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    for path in (tmp_path / "notes.txt", tmp_path / "missing", tmp_path):
        with pytest.raises(InitialWeightsError, match="no weights file"):
            read_initial(path)
    (tmp_path / "bad.safetensors").write_bytes(b"\x00" * 20)
    with pytest.raises(InitialWeightsError, match="unreadable"):
        read_initial(tmp_path / "bad.safetensors")


CAM = "observation.images.front"
SMALL_ACT = dict(
    chunk_size=3,
    n_action_steps=3,
    dim_model=32,
    n_heads=2,
    dim_feedforward=64,
    n_encoder_layers=1,
    n_decoder_layers=1,
)


@pytest.mark.slow
def test_a_lerobot_pretrained_model_directory_starts_a_lerobot_policy(tmp_path: Path) -> None:
    from lerobot.policies.act.configuration_act import ACTConfig
    from lerobot.policies.act.modeling_act import ACTPolicy

    from cloud_learner.policies.lerobot_adapter import _features, make_lerobot_policy

    inputs, outputs = _features(D, A, [CAM], (16, 16))
    torch.manual_seed(7)
    saved = ACTPolicy(
        ACTConfig(
            input_features=inputs,
            output_features=outputs,
            device="cpu",
            pretrained_backbone_weights=None,
            **SMALL_ACT,
        )
    )
    saved.save_pretrained(tmp_path / "pretrained_model")  # LeRobot's own writer
    loaded = make_lerobot_policy(
        "act", D, A, [CAM], (16, 16), pretrained_path=tmp_path / "pretrained_model"
    )
    assert loaded.chunk_size == 3
    for key, value in saved.state_dict().items():
        assert torch.equal(loaded.policy.state_dict()[key], value), key
    # Robots with another camera cannot run it: the feature is named, nothing is built.
    with pytest.raises(ValueError, match="observation.images.wrist: on the robots, not in"):
        make_lerobot_policy(
            "act",
            D,
            A,
            [CAM, "observation.images.wrist"],
            (16, 16),
            pretrained_path=tmp_path / "pretrained_model",
        )
    with pytest.raises(ValueError, match="not a LeRobot pretrained_model"):
        make_lerobot_policy("act", D, A, [CAM], (16, 16), pretrained_path=tmp_path)
