"""The weak initial policy of a run: normalisation reaches every network of an algorithm, and
behaviour cloning works per algorithm (SAC's Gaussian: mean by MSE, spread by likelihood)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cloud_learner.algorithms import RECAP, SACRLPD, HGDAgger
from cloud_learner.algorithms.sac_rlpd import SACConfig, gaussian_bc_loss
from cloud_learner.policies import MLPPolicy, PolicySpec
from cloud_learner.policies.base import TorchPolicy
from cloud_learner.policies.gaussian import GaussianPolicy
from cloud_learner.warm_start import fit_state_normalization

D, A, B = 6, 2, 64


def demo_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """Actions a fixed smooth function of the state, some saturated at +-1 like an expert's."""
    g = torch.Generator().manual_seed(seed)
    state = torch.randn(B, D, generator=g) * 3 + 5
    action = torch.tanh(state[:, :A] - 5).clamp(-0.8, 0.8) / 0.8
    return {
        "observation.state": state,
        "next.observation.state": state,
        "action": action,
        "task_index": torch.zeros(B, dtype=torch.long),
        "is_intervention": torch.ones(B, dtype=torch.bool),
        "reward": torch.zeros(B),
        "terminated": torch.zeros(B, dtype=torch.bool),
        "truncated": torch.zeros(B, dtype=torch.bool),
    }


def networks(algorithm: object) -> list[TorchPolicy]:
    found: dict[int, TorchPolicy] = {}
    for value in vars(algorithm).values():
        if isinstance(value, torch.nn.Module):
            for m in value.modules():
                if isinstance(m, TorchPolicy):
                    found[id(m)] = m
    return list(found.values())


def test_normalisation_reaches_policy_value_functions_and_critics() -> None:
    torch.manual_seed(0)
    states = demo_batch()["observation.state"].numpy()
    sac = SACRLPD(GaussianPolicy(PolicySpec(D, A, hidden=16)), SACConfig(hidden=16))
    recap = RECAP(MLPPolicy(PolicySpec(D, A, hidden=16, indicator=True)))
    for algorithm, expected in ((sac, 5), (recap, 3)):  # actor + 2 critics + 2 targets
        assert fit_state_normalization(algorithm, states, min_std=0.05) == expected
        for net in networks(algorithm):
            np.testing.assert_allclose(net.state_mean.numpy(), states.mean(0), rtol=1e-5)  # type: ignore[operator]
            np.testing.assert_allclose(net.state_std.numpy(), states.std(0), rtol=1e-4)  # type: ignore[operator]


def test_sac_warm_start_clones_the_mean_and_narrows_the_spread() -> None:
    torch.manual_seed(0)
    sac = SACRLPD(GaussianPolicy(PolicySpec(D, A, hidden=32)), SACConfig(hidden=32, lr=3e-3))
    batch = demo_batch()
    fit_state_normalization(sac, batch["observation.state"].numpy(), min_std=0.05)
    critics_before = {k: v.clone() for k, v in sac.critics.state_dict().items()}
    first = sac.bc_update(batch)
    for _ in range(300):
        last = sac.bc_update(batch)
    assert set(last) == {"bc_mse", "bc_nll"}
    assert last["bc_mse"] < 0.1 * first["bc_mse"]
    assert last["bc_nll"] < first["bc_nll"] - 1.0
    with torch.no_grad():
        _, log_std = sac.policy.distribution(batch)
    assert float(log_std.exp().mean()) < 0.5  # started near 1
    # RLPD's critics start untrained: the warm start touches only the actor.
    for k, v in sac.critics.state_dict().items():
        torch.testing.assert_close(v, critics_before[k])


def test_gaussian_bc_loss_holds_the_mean_fixed_in_the_likelihood_term() -> None:
    torch.manual_seed(0)
    policy = GaussianPolicy(PolicySpec(D, A, hidden=8))
    mse, nll = gaussian_bc_loss(policy, demo_batch())
    mean_params = list(policy.head[-1].parameters())
    grads = torch.autograd.grad(nll, mean_params)
    # The last layer's first A outputs are the mean: no likelihood gradient reaches them.
    assert float(grads[0][:A].abs().max()) == 0.0 and float(grads[1][:A].abs().max()) == 0.0
    assert float(grads[0][A:].abs().max()) > 0.0
    assert float(mse.detach()) > 0.0


@pytest.mark.parametrize("kind", ["hg_dagger", "recap"])
def test_regression_algorithms_warm_start_with_their_own_update(kind: str) -> None:
    torch.manual_seed(0)
    algorithm = (
        HGDAgger(MLPPolicy(PolicySpec(D, A, hidden=16)))
        if kind == "hg_dagger"
        else RECAP(MLPPolicy(PolicySpec(D, A, hidden=16, indicator=True)))
    )
    batch = demo_batch()
    first = algorithm.bc_update(batch)
    for _ in range(200):
        last = algorithm.bc_update(batch)
    assert "loss" in last and last["loss"] < 0.5 * first["loss"]
    if kind == "recap":
        assert last["positive_fraction"] == 1.0  # demonstrations are interventions: positive
