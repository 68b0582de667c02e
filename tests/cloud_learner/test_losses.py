"""Each algorithm's loss on a small fixed batch against a value computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from cloud_learner.algorithms import RECAP, HGDAgger, HGDAggerConfig, RECAPConfig
from cloud_learner.algorithms.recap import improvement_indicator, nstep_return, sparse_rewards
from cloud_learner.algorithms.sac_rlpd import SACRLPD, SACConfig, actor_loss, critic_target
from cloud_learner.policies import (
    INDICATOR_NEGATIVE,
    INDICATOR_NULL,
    INDICATOR_POSITIVE,
    FlowMatchingPolicy,
    PolicySpec,
)
from cloud_learner.policies.gaussian import GaussianPolicy, tanh_gaussian_log_prob
from tests.cloud_learner.helpers import constant_policy


def _batch(**kw: torch.Tensor) -> dict[str, torch.Tensor]:
    base = {
        "observation.state": torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]),
        "task_index": torch.zeros(3, dtype=torch.long),
    }
    base.update(kw)
    return base


def test_hg_dagger_weighted_bc_loss_by_hand() -> None:
    policy = constant_policy([0.5, -1.0])
    algo = HGDAgger(
        policy, HGDAggerConfig(intervention_weight=2.0, demonstration_weight=1.0, novice_weight=0.0)
    )
    batch = _batch(
        action=torch.tensor([[1.0, -1.0], [0.0, 0.0], [0.5, 1.0]]),
        is_intervention=torch.tensor([True, False, True]),
        is_demonstration=torch.tensor([True, False, False]),
    )
    # Per-row MSE: row0 ((0.5-1)^2 + 0)/2 = 0.125; row1 (0.25 + 1)/2 = 0.625; row2 (0 + 4)/2 = 2.
    # Weights: demo 1, novice 0, correction 2 -> (1*0.125 + 0*0.625 + 2*2) / 3 = 1.375.
    loss, metrics = algo.loss(batch)
    assert float(loss.detach()) == pytest.approx(1.375)
    assert metrics["labelled_fraction"] == pytest.approx(2 / 3)
    before = policy.head[0].bias.clone()
    algo.update(batch)
    assert not torch.equal(before, policy.head[0].bias)  # the step moved the parameters


def test_flow_matching_loss_by_hand() -> None:
    spec = PolicySpec(state_dim=2, action_dim=1, chunk_size=2, depth=0)
    policy = FlowMatchingPolicy(spec)
    with torch.no_grad():
        policy.velocity[0].weight.zero_()
        policy.velocity[0].bias.copy_(torch.tensor([1.0, 0.0]))
    batch = _batch(action_chunk=torch.tensor([[[2.0], [0.0]], [[1.0], [1.0]], [[0.0], [-1.0]]]))
    noise = torch.tensor([[0.0, 1.0], [1.0, 1.0], [-1.0, 0.0]])
    # target velocity u = x1 - x0: [2, -1], [0, 0], [1, -1]; v = [1, 0] everywhere.
    # per row mean (v - u)^2: (1 + 1)/2 = 1, (1 + 0)/2 = 0.5, (0 + 1)/2 = 0.5.
    loss = policy.bc_loss(batch, noise=noise, time=torch.tensor([0.1, 0.5, 0.9]))
    assert loss.tolist() == pytest.approx([1.0, 0.5, 0.5])


def test_recap_sparse_rewards_and_nstep_return_by_hand() -> None:
    cfg = RECAPConfig(failure_penalty=10.0, return_scale=0.1, gamma=1.0)
    batch = {
        # row0: 3 steps, no end; row1: success at step 2 (terminated, reward 1); row2: timeout
        # at step 1 (failure).
        "reward": torch.tensor([[0.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]),
        "terminated": torch.tensor([[0, 0, 0], [0, 1, 0], [0, 0, 0]], dtype=torch.bool),
        "truncated": torch.tensor([[0, 0, 0], [0, 0, 0], [1, 0, 0]], dtype=torch.bool),
    }
    r, done = sparse_rewards(batch, cfg)
    expected = torch.tensor([[-0.1, -0.1, -0.1], [-0.1, -0.1, 0.0], [-0.1 - 1.0, 0.0, 0.0]])
    torch.testing.assert_close(r, expected)
    assert done.tolist() == [[0, 0, 0], [0, 1, 0], [1, 0, 0]]
    g = nstep_return(r, done, bootstrap=torch.tensor([-0.5, -0.5, -0.5]), gamma=1.0)
    # row0 bootstraps: -0.3 - 0.5; rows 1-2 ended inside the window: no bootstrap.
    assert g.tolist() == pytest.approx([-0.8, -0.2, -1.1])
    g_disc = nstep_return(r[:1], done[:1], torch.tensor([-0.5]), gamma=0.5)
    assert float(g_disc[0]) == pytest.approx(-0.1 - 0.05 - 0.025 - 0.125 * 0.5)


def test_recap_indicator_per_task_threshold_and_forced_interventions() -> None:
    advantage = torch.tensor([0.2, -0.1, 0.05, 0.3, -0.4])
    task = torch.tensor([0, 0, 1, 1, 1])
    thresholds = torch.tensor([0.0, 0.1])
    inter = torch.tensor([False, False, False, False, True])
    ind = improvement_indicator(advantage, task, thresholds, inter)
    P, N = INDICATOR_POSITIVE, INDICATOR_NEGATIVE
    assert ind.tolist() == [P, N, N, P, P]


def test_recap_value_loss_and_policy_loss_by_hand() -> None:
    policy = constant_policy([0.0], indicator=True)
    algo = RECAP(
        policy,
        RECAPConfig(
            failure_penalty=10.0,
            return_scale=0.1,
            indicator_dropout=0.0,
            lr=0.0,
            value_lr=0.0,
            positive_fraction=0.5,
        ),
    )
    for net in (algo.value, algo.value_target):
        with torch.no_grad():
            net.head[0].weight.zero_()
            net.head[0].bias.fill_(-0.5)
    batch = _batch(
        action=torch.tensor([[1.0], [2.0], [0.0]]),
        reward=torch.tensor([0.0, 1.0, 0.0]),
        terminated=torch.tensor([False, True, False]),
        truncated=torch.tensor([False, False, True]),
        is_intervention=torch.tensor([False, False, True]),
        **{"next.observation.state": torch.zeros(3, 2)},
    )
    metrics = algo.update(batch)
    # targets: -0.1 + V' = -0.6 ; success -0.1 ; failure -0.1 - 1.0 = -1.1.  V = -0.5.
    # value loss = mean((-0.5 - t)^2) = (0.01 + 0.16 + 0.36) / 3.
    assert metrics["value_loss"] == pytest.approx((0.01 + 0.16 + 0.36) / 3)
    # advantages -0.1, 0.4, -0.6; median threshold -0.1 -> only row1 above it, row2 forced.
    assert metrics["advantage_mean"] == pytest.approx(-0.1)
    assert metrics["positive_fraction"] == pytest.approx(2 / 3)
    # Policy loss: the indicator embedding feeds a zero weight matrix, prediction 0 everywhere.
    assert metrics["loss"] == pytest.approx((1.0 + 4.0 + 0.0) / 3)


def test_cfg_guidance_extrapolates_from_the_null_branch() -> None:
    policy = constant_policy([0.0], indicator=True)
    with torch.no_grad():
        assert policy.indicator_embedding is not None
        policy.head[0].weight.zero_()
        policy.head[0].weight[0, -8] = 1.0  # reads the first embedding channel only
        policy.indicator_embedding.weight[:, 0] = torch.tensor([-1.0, 3.0, 1.0])
    batch = _batch()
    assert policy.predict(batch, torch.full((3,), INDICATOR_NULL))[0].item() == 1.0
    policy.guidance_weight = 2.5
    # a = null + w (pos - null) = 1 + 2.5 * (3 - 1) = 6
    assert policy.predict_guided(batch)[:, 0].tolist() == pytest.approx([6.0, 6.0, 6.0])
    assert policy.act({"observation.state": torch.zeros(2).numpy()}, 0).tolist() == [6.0]


def test_sac_critic_target_and_actor_loss_by_hand() -> None:
    y = critic_target(
        reward=torch.tensor([1.0, 0.0]),
        terminated=torch.tensor([False, True]),
        next_q=torch.tensor([[2.0, 5.0], [3.0, 4.0]]),
        next_log_prob=torch.tensor([-1.0, 0.5]),
        alpha=0.2,
        gamma=0.9,
    )
    # row0: 1 + 0.9 * (min(2, 3) + 0.2) = 2.98; row1 terminated: 0.
    assert y.tolist() == pytest.approx([2.98, 0.0])
    loss = actor_loss(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([-1.0, 0.5]), 0.2)
    # mean(0.2 * -1 - 2, 0.2 * 0.5 - 3) = (-2.2 - 2.9) / 2
    assert float(loss) == pytest.approx(-2.55)


def test_tanh_gaussian_log_prob_matches_change_of_variables() -> None:
    u = torch.tensor([[0.3, -1.2]])
    mean = torch.tensor([[0.1, -1.0]])
    log_std = torch.tensor([[-0.5, 0.2]])
    expected = 0.0
    for i in range(2):
        s = math.exp(float(log_std[0, i]))
        z = (float(u[0, i]) - float(mean[0, i])) / s
        expected += -0.5 * z * z - math.log(s) - 0.5 * math.log(2 * math.pi)
        expected -= math.log(1 - math.tanh(float(u[0, i])) ** 2)
    assert float(tanh_gaussian_log_prob(u, mean, log_std)[0]) == pytest.approx(expected, rel=1e-5)


def test_sac_update_reduces_critic_error_on_a_fixed_batch() -> None:
    torch.manual_seed(0)
    policy = GaussianPolicy(PolicySpec(state_dim=2, action_dim=1, hidden=32))
    algo = SACRLPD(policy, SACConfig(hidden=32, num_critics=4, critic_subset=2, lr=1e-2))
    batch = _batch(
        action=torch.tensor([[0.5], [-0.5], [0.0]]),
        reward=torch.tensor([1.0, -1.0, 0.0]),
        terminated=torch.ones(3, dtype=torch.bool),  # targets are the rewards exactly
        **{"next.observation.state": torch.zeros(3, 2)},
    )
    first = algo.update(batch)["critic_loss"]
    for _ in range(120):
        last = algo.update(batch)["critic_loss"]
    assert last < 0.05 * first


def test_sac_rejects_a_subset_larger_than_the_ensemble() -> None:
    with pytest.raises(ValueError, match="critic_subset"):
        SACRLPD(
            GaussianPolicy(PolicySpec(state_dim=2, action_dim=1)),
            SACConfig(num_critics=2, critic_subset=3),
        )


def test_recap_trains_a_flow_matching_chunk_policy_with_guidance() -> None:
    torch.manual_seed(0)
    spec = PolicySpec(
        state_dim=2, action_dim=2, chunk_size=3, hidden=16, num_tasks=2, indicator=True
    )
    algo = RECAP(FlowMatchingPolicy(spec), RECAPConfig(guidance_weight=1.5))
    batch = _batch(
        action_chunk=torch.randn(3, 3, 2),
        reward=torch.tensor([0.0, 1.0, 0.0]),
        terminated=torch.tensor([False, True, False]),
        truncated=torch.tensor([False, False, True]),
        is_intervention=torch.tensor([False, False, True]),
        task_index=torch.tensor([0, 1, 1]),
        **{"next.observation.state": torch.zeros(3, 2)},
    )
    metrics = algo.update(batch)
    assert all(math.isfinite(v) for v in metrics.values())
    assert algo.policy.guidance_weight == 1.5
    assert algo.policy.act({"observation.state": torch.zeros(2).numpy()}, 1).shape == (3, 2)
    with pytest.raises(ValueError, match="indicator=True"):
        RECAP(FlowMatchingPolicy(PolicySpec(state_dim=2, action_dim=2)))
