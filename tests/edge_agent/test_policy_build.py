"""Edge-side policy construction from a weight version's policy card: HG-DAgger's MLP, RECAP's
"positive"-conditioned MLP, SAC's Gaussian that samples while training; card-less weights
load as before; bad cards and misfits are refused with the running policy untouched."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load as st_load

from cloud_learner.policies import MLPPolicy, PolicySpec
from cloud_learner.policies.base import INDICATOR_NULL, INDICATOR_POSITIVE, TorchPolicy
from cloud_learner.policies.gaussian import GaussianPolicy
from cloud_learner.policy_card import (
    CARD_KEY,
    CardPublisher,
    PolicyCard,
    PolicyCardError,
    card_for,
    split_card,
    with_card,
)
from comms.cloud.weight_file import WeightDirectory
from edge_agent.inference import LocalPolicyRunner
from edge_agent.policy_build import CardPolicy

D, A, TASKS, HIDDEN = 39, 4, 3, 16


def obs(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"observation.state": rng.normal(size=D).astype(np.float32)}


def trained(kind: str, indicator: bool = False, guidance: float = 1.0) -> TorchPolicy:
    torch.manual_seed(1)
    spec = PolicySpec(D, A, num_tasks=TASKS, hidden=HIDDEN, indicator=indicator)
    policy: TorchPolicy = GaussianPolicy(spec) if kind == "gaussian" else MLPPolicy(spec)
    policy.guidance_weight = guidance
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.3)  # not the freshly initialised network
    return policy


def published(policy: TorchPolicy, algorithm: str, tmp_path: Path) -> dict[str, torch.Tensor]:
    """Weights as a robot gets them: through the learner's weight directory and safetensors."""
    pub = CardPublisher(WeightDirectory(tmp_path / "weights"), card_for(algorithm, policy))
    pub.publish(1, policy.get_weights())
    assert pub.latest_version() == 1
    raw = (tmp_path / "weights" / "v00000001.safetensors").read_bytes()
    return st_load(raw)


def robot(stochastic: bool = True) -> CardPolicy:
    return CardPolicy(D, A, TASKS, hidden=64, stochastic=stochastic, seed=3)


def test_hg_dagger_card_builds_the_deterministic_mlp(tmp_path: Path) -> None:
    mlp = trained("mlp")
    p = robot()
    p.set_weights(published(mlp, "hg_dagger", tmp_path))
    assert p.kind == "mlp" and isinstance(p.policy, MLPPolicy)
    assert p.policy.spec.hidden == HIDDEN  # from the card, not the robot's fallback width
    np.testing.assert_array_equal(p.act(obs(), 2), mlp.act(obs(), 2))
    np.testing.assert_array_equal(p.act(obs(), 2), p.act(obs(), 2))


def test_recap_card_acts_on_positive_with_the_cards_guidance_weight(tmp_path: Path) -> None:
    recap = trained("mlp", indicator=True, guidance=2.0)
    p = robot()
    p.set_weights(published(recap, "recap", tmp_path))
    assert p.card is not None and p.card.algorithm == "recap" and p.card.guidance_weight == 2.0
    assert p.policy.inference_indicator == INDICATOR_POSITIVE
    batch = {
        "observation.state": torch.from_numpy(obs()["observation.state"])[None],
        "task_index": torch.tensor([1]),
    }
    with torch.no_grad():
        pos = recap.predict(batch, torch.tensor([INDICATOR_POSITIVE]))[0].numpy()
        null = recap.predict(batch, torch.tensor([INDICATOR_NULL]))[0].numpy()
    np.testing.assert_allclose(p.act(obs(), 1), null + 2.0 * (pos - null), rtol=1e-5, atol=1e-6)
    assert not np.allclose(p.act(obs(), 1), pos)  # guidance really changed the action


def test_sac_card_samples_while_training_and_acts_with_the_mean_in_evaluation(
    tmp_path: Path,
) -> None:
    sac = trained("gaussian")
    weights = published(sac, "sac_rlpd", tmp_path)
    train, evaluation = robot(stochastic=True), robot(stochastic=False)
    train.set_weights(weights)
    evaluation.set_weights(weights)
    assert train.kind == evaluation.kind == "gaussian"
    mean = sac.act(obs(), 0)  # tanh(mu)
    np.testing.assert_array_equal(evaluation.act(obs(), 0), mean)
    samples = np.stack([train.act(obs(), 0) for _ in range(400)])
    assert samples.shape == (400, A) and np.abs(samples).max() <= 1.0
    assert len({s.tobytes() for s in samples}) == 400  # every step draws afresh
    # The samples follow the policy's Gaussian: pre-squash mean and spread match mu and sigma.
    batch = {
        "observation.state": torch.from_numpy(obs()["observation.state"])[None],
        "task_index": torch.tensor([0]),
    }
    assert isinstance(sac, GaussianPolicy)
    with torch.no_grad():
        mu, log_std = sac.distribution(batch)
    u = np.arctanh(np.clip(samples, -0.999999, 0.999999))
    np.testing.assert_allclose(u.mean(0), mu[0].numpy(), atol=4 * log_std.exp().max().item() / 20)
    np.testing.assert_allclose(u.std(0), log_std[0].exp().numpy(), rtol=0.2)


def test_weights_without_a_card_load_into_the_fallback_mlp_as_before() -> None:
    old = MLPPolicy(PolicySpec(D, A, num_tasks=TASKS, hidden=64))
    p = robot()
    p.set_weights(old.get_weights())
    assert p.card is None and p.kind == "mlp"
    np.testing.assert_array_equal(p.act(obs(), 1), old.act(obs(), 1))
    assert CARD_KEY not in p.get_weights()


def test_a_new_card_replaces_the_policy_and_get_weights_round_trips(tmp_path: Path) -> None:
    p = robot()
    p.set_weights(published(trained("mlp"), "hg_dagger", tmp_path / "a"))
    p.set_weights(published(trained("gaussian"), "sac_rlpd", tmp_path / "b"))
    assert p.kind == "gaussian"
    again = robot()
    again.set_weights(p.get_weights())
    assert again.card == p.card
    np.testing.assert_array_equal(
        again.policy.get_weights()["head.0.weight"], p.policy.get_weights()["head.0.weight"]
    )


def test_a_card_that_does_not_fit_the_robot_is_refused_naming_the_field(tmp_path: Path) -> None:
    p = robot()
    p.set_weights(published(trained("mlp"), "hg_dagger", tmp_path / "ok"))
    before = p.act(obs(), 0)
    other = GaussianPolicy(PolicySpec(D, A, num_tasks=TASKS + 1, hidden=HIDDEN))
    runner = LocalPolicyRunner(p, A, version=1)
    with pytest.raises(ValueError, match="num_tasks"):
        runner.set_weights(2, published(other, "sac_rlpd", tmp_path / "bad"))
    assert runner.policy_version == 1 and p.kind == "mlp"
    np.testing.assert_array_equal(p.act(obs(), 0), before)


def test_tensors_that_do_not_fit_their_card_are_refused_and_nothing_changes(
    tmp_path: Path,
) -> None:
    p = robot()
    good = published(trained("mlp"), "hg_dagger", tmp_path)
    p.set_weights(good)
    before = p.act(obs(), 0)
    broken = dict(good)
    broken["head.0.weight"] = torch.zeros(3, 3)
    with pytest.raises(ValueError, match=r"head\.0\.weight"):
        p.set_weights(broken)
    # MLP tensors under a Gaussian card: its head outputs 2A (mean, log_std), not A.
    gaussian_card = with_card(
        {k: v for k, v in good.items() if k != CARD_KEY},
        card_for("sac_rlpd", GaussianPolicy(PolicySpec(D, A, num_tasks=TASKS, hidden=HIDDEN))),
    )
    with pytest.raises(ValueError, match=r"head\.4\.weight: expected shape \(8, 16\)"):
        p.set_weights(gaussian_card)
    assert p.kind == "mlp"
    np.testing.assert_array_equal(p.act(obs(), 0), before)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"not json", "not JSON"),
        (b'{"format": 9, "kind": "mlp", "spec": {}}', "format 9"),
        (b'{"format": 1, "kind": "transformer", "spec": {}}', "transformer"),
        (b'{"format": 1, "kind": "mlp", "spec": {"state_dim": 39, "colour": 1}}', "colour"),
    ],
)
def test_unreadable_cards_are_refused_by_reason(raw: bytes, message: str) -> None:
    weights = {CARD_KEY: torch.frombuffer(bytearray(raw), dtype=torch.uint8)}
    with pytest.raises(PolicyCardError, match=message):
        split_card(weights)


def test_card_json_round_trip() -> None:
    card = PolicyCard("recap", "mlp", PolicySpec(D, A, num_tasks=2, indicator=True), 1.5)
    back, rest = split_card(with_card({}, card))
    assert back == card and rest == {}


CAM = "observation.images.corner"


def camera_obs(seed: int = 0, size: int = 16) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {**obs(seed), CAM: rng.integers(0, 256, (size, size, 3), dtype=np.uint8)}


def test_a_cnn_card_runs_on_the_robots_frames_and_checks_its_cameras(tmp_path: Path) -> None:
    torch.manual_seed(2)
    spec = PolicySpec(
        D, A, num_tasks=TASKS, image_keys=[CAM], image_shape=(16, 16), hidden_sizes=[32, 8]
    )
    cnn = MLPPolicy(spec)
    weights = published(cnn, "hg_dagger", tmp_path)
    on_robot = CardPolicy(D, A, TASKS, hidden=64, cameras={CAM: (16, 16)})
    on_robot.set_weights(weights)
    for seed in range(3):
        assert np.allclose(on_robot.act(camera_obs(seed), 1), cnn.act(camera_obs(seed), 1))
    # The frames matter: another image, another action.
    assert not np.allclose(on_robot.act(camera_obs(0), 1), on_robot.act(camera_obs(1), 1))
    for cameras, why in (({}, "the policy sees it"), ({CAM: (32, 32)}, r"robot has \(32, 32\)")):
        blind = CardPolicy(D, A, TASKS, hidden=64, cameras=cameras)
        with pytest.raises(PolicyCardError, match=why):
            blind.set_weights(weights)


def test_a_flow_chunk_card_gives_whole_chunks_the_runner_executes_step_by_step(
    tmp_path: Path,
) -> None:
    from cloud_learner.policies import FlowMatchingPolicy

    torch.manual_seed(3)
    flow = FlowMatchingPolicy(PolicySpec(D, A, num_tasks=TASKS, chunk_size=4, hidden_sizes=[32]))
    on_robot = CardPolicy(D, A, TASKS, hidden=64)
    on_robot.set_weights(published(flow, "hg_dagger", tmp_path))
    assert on_robot.kind == "flow" and on_robot.card is not None and on_robot.card.chunk_size == 4
    runner = LocalPolicyRunner(on_robot, A, version=5)
    boundaries = []
    for _ in range(8):
        boundaries.append(runner.at_chunk_boundary)
        action, version = runner.act(obs(), 0)
        assert action.shape == (A,) and version == 5
    assert boundaries == [True, False, False, False] * 2  # one policy call per chunk


@pytest.mark.slow
def test_a_lerobot_act_card_builds_the_same_network_on_the_robot(tmp_path: Path) -> None:
    from cloud_learner.policies.lerobot_adapter import make_lerobot_policy

    torch.manual_seed(4)
    act = make_lerobot_policy(
        "act",
        D,
        A,
        [CAM],
        (16, 16),
        chunk_size=3,
        dim_model=32,
        n_heads=2,
        dim_feedforward=64,
        n_encoder_layers=1,
        n_decoder_layers=1,
    )
    act.set_state_normalization(np.random.default_rng(0).normal(size=(64, D)))
    act.set_action_normalization(np.random.default_rng(1).normal(2.0, 0.5, size=(64, A)))
    weights = published(act, "hg_dagger", tmp_path)
    on_robot = CardPolicy(D, A, TASKS, hidden=64, cameras={CAM: (16, 16)})
    on_robot.set_weights(weights)
    assert on_robot.kind == "lerobot" and on_robot.card is not None
    assert on_robot.card.chunk_size == 3
    chunk = on_robot.act(camera_obs(0), 0)
    assert chunk.shape == (3, A)
    assert np.allclose(chunk, act.act(camera_obs(0), 0), atol=1e-5)
    # Its normalisation travelled with the weights: actions come back in robot units.
    assert torch.equal(on_robot.get_weights()["norm_action_mean"], act.norm_action_mean)
