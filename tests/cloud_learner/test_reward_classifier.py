"""The reward classifier (``cloud_learner.reward_classifier``): trained on labelled episodes of a
blind Meta-World reach robot (the simulator's ground truth as the person's verdicts), it
separates held-out success frames from failure frames; its tensors round-trip; policy loaders
ignore them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import load, save, save_file

from cloud_learner.classifier_training import to_episodes
from cloud_learner.init_weights import read_initial
from cloud_learner.policies import MLPPolicy, PolicySpec
from cloud_learner.policy_card import card_for, split_card, with_card
from cloud_learner.reward_classifier import (
    CARD_KEY,
    PREFIX,
    LabelledEpisode,
    RewardClassifier,
    RewardClassifierError,
    episode_precision_recall,
    fit_reward_classifier,
    holdout,
    training_frames,
)
from edge_agent.policy_build import CardPolicy
from tests.fakes.labelled_reach import ReachEpisodes, reach_episodes


@pytest.fixture(scope="module")
def reach() -> ReachEpisodes:
    return reach_episodes(36, steps=60)


@pytest.fixture(scope="module")
def model(reach: ReachEpisodes) -> RewardClassifier:
    return fit_reward_classifier(reach.episodes[:26], reach.features, epochs=25, version=3)


def test_it_separates_held_out_success_frames_from_failure_frames(reach, model) -> None:
    held = reach.episodes[26:]
    verdicts = [e.verdict for e in held]
    assert "success" in verdicts and "failure" in verdicts
    pos = np.array(
        [
            model.success_probability(e.frames)[e.verdict_frame]
            for e in held
            if e.verdict == "success"
        ]
    )
    neg = np.concatenate(
        [model.success_probability(e.frames) for e in held if e.verdict == "failure"]
    )
    # AUC of held-out verdict frames of successes against every frame of failures
    auc = float((pos[:, None] > neg[None, :]).mean())
    assert auc >= 0.9, (auc, pos, neg.max())
    precision, recall, n = episode_precision_recall(model, held, 0.5)
    assert n == len(held) and precision >= 0.5 and recall >= 0.5, (precision, recall)


def test_the_recipe_takes_verdict_frames_as_positives_and_keeps_a_margin() -> None:
    frames = {"observation.state": np.arange(20, dtype=np.float32)[:, None]}
    ok = LabelledEpisode(frames, "success", 15)
    bad = LabelledEpisode(frames, "failure", 19)
    x, y = training_frames([ok, bad], ["observation.state"])
    got = x["observation.state"][:, 0]
    # success: frames 0..9 negatives, 14 and 15 positives, 10..13 and 16.. left out
    assert got[y == 1].tolist() == [14.0, 15.0]
    assert got[:12][y[:12] == 0].tolist() == list(range(10))
    assert len(y) == 12 + 20 and y[12:].sum() == 0


def test_tensors_round_trip_through_safetensors(reach, model) -> None:
    tensors = model.to_tensors()
    assert all(k.startswith(PREFIX) for k in tensors) and CARD_KEY in tensors
    again = RewardClassifier.from_tensors(load(save(tensors)))
    assert (again.version, again.threshold, again.keys) == (3, 0.5, model.keys)
    ep = reach.episodes[0]
    np.testing.assert_allclose(
        again.success_probability(ep.frames), model.success_probability(ep.frames), atol=1e-6
    )


def test_bad_inputs_are_refused_by_name(reach) -> None:
    only = [e for e in reach.episodes if e.verdict == "success"][:3]
    with pytest.raises(RewardClassifierError, match="success and failure"):
        fit_reward_classifier(only, reach.features, epochs=1)
    with pytest.raises(RewardClassifierError, match="observation.images|observation.state"):
        RewardClassifier({"action": {"dtype": "float32", "shape": (4,)}})
    broken = {CARD_KEY: torch.tensor([1, 2, 3], dtype=torch.uint8)}
    with pytest.raises(RewardClassifierError, match="not JSON"):
        RewardClassifier.from_tensors(broken)
    with pytest.raises(RewardClassifierError, match="verdict_frame"):
        training_frames(
            [LabelledEpisode({"observation.state": np.zeros((3, 2))}, "failure", 5)],
            ["observation.state"],
        )


def test_images_and_state_together() -> None:
    features = {
        "observation.state": {"dtype": "float32", "shape": (3,)},
        "observation.images.front": {"dtype": "uint8", "shape": (48, 48, 3)},
    }
    rng = np.random.default_rng(0)

    def ep(verdict: str) -> LabelledEpisode:
        frames = {
            "observation.state": rng.normal(size=(12, 3)).astype(np.float32),
            "observation.images.front": rng.integers(0, 255, (12, 48, 48, 3), dtype=np.uint8),
        }
        if verdict == "success":  # a bright frame shows the task solved
            frames["observation.images.front"][-2:] = 255
        return LabelledEpisode(frames, verdict, 11)

    m = fit_reward_classifier([ep("success"), ep("failure")] * 4, features, epochs=40)
    test = [ep("success"), ep("failure")]
    assert episode_precision_recall(m, test, 0.5)[:2] == (1.0, 1.0)
    assert sorted(RewardClassifier.from_tensors(m.to_tensors()).keys) == sorted(features)


def test_policy_loaders_ignore_the_classifier_tensors(tmp_path, model) -> None:
    spec = PolicySpec(39, 4, num_tasks=1, hidden=16)
    policy = MLPPolicy(spec)
    version = {
        **with_card(policy.get_weights(), card_for("hg_dagger", policy)),
        **model.to_tensors(),
    }
    card, rest = split_card(version)
    assert card is not None and not any(k.startswith(PREFIX) for k in rest)
    robot = CardPolicy(39, 4, 1, 16)
    robot.set_weights(version)  # strict loading: extra tensors would be refused
    assert robot.kind == "mlp"
    save_file(version, str(tmp_path / "promoted.safetensors"))
    initial = read_initial(tmp_path / "promoted.safetensors")
    assert set(initial.tensors) == set(policy.get_weights())


def test_held_out_episodes_are_fixed_by_key() -> None:
    keys = [("run-1", "robot-1", i) for i in range(400)]
    held = [holdout(k, 0.25) for k in keys]
    assert held == [holdout(k, 0.25) for k in keys]
    assert 0.15 < np.mean(held) < 0.35
    assert not any(holdout(k, 0.0) for k in keys)


def test_batch_service_reply_becomes_episodes() -> None:
    header = [
        {
            "run_id": "r",
            "robot_id": "1",
            "episode_index": 4,
            "verdict": "success",
            "task_index": 0,
            "steps": 2,
        },
        {
            "run_id": "r",
            "robot_id": "1",
            "episode_index": 7,
            "verdict": "failure",
            "task_index": 0,
            "steps": 3,
        },
    ]
    arrays = {
        "next.observation.state": np.arange(5, dtype=np.float32)[:, None],
        "frame_index": np.array([0, 1, 0, 1, 2]),
    }
    pairs = to_episodes(header, arrays)
    assert [k for k, _ in pairs] == [("r", "1", 4), ("r", "1", 7)]
    assert pairs[1][1].frames["observation.state"][:, 0].tolist() == [2.0, 3.0, 4.0]
    assert [(e.verdict, e.verdict_frame) for _, e in pairs] == [("success", 1), ("failure", 2)]
