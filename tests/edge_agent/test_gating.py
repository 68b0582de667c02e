"""HG-DAgger gating decisions on recorded expert/novice traces (real Meta-World expert)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge_agent.config import RiskRegion
from edge_agent.gating import HGDaggerGate
from edge_agent.operators import ScriptedOperator


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    """40 steps of reach-v3 driven by its scripted expert, recorded to disk and read back."""
    from hal.drivers.metaworld import MetaWorldDriver, expert_policy

    d = MetaWorldDriver("trace-robot", task="reach-v3", max_episode_steps=100)
    expert = expert_policy("reach-v3")
    d.connect()
    obs = d.reset(seed=3)
    states, actions = [], []
    for _ in range(40):
        a = expert(obs)
        states.append(obs["observation.state"])
        actions.append(a)
        d.send_action({"action": a})
        obs = d.get_observation()
    d.disconnect()
    path = Path(tmp_path_factory.mktemp("trace")) / "reach.npz"
    np.savez(path, state=np.stack(states), expert=np.stack(actions))
    loaded = np.load(path)
    return {"state": loaded["state"], "expert": loaded["expert"]}


def novice_from(expert: np.ndarray, diverge: range, offset: float, jitter: float) -> np.ndarray:
    rng = np.random.default_rng(0)
    nov = expert + rng.uniform(-jitter, jitter, expert.shape).astype(np.float32)
    nov[list(diverge)] += offset
    return nov


def test_takeover_at_divergence_and_handback_after_k_agreeing_steps(trace):
    k = 4
    gate = HGDaggerGate(threshold=0.3, handback_steps=k, norm="linf")
    nov = novice_from(trace["expert"], range(10, 15), offset=0.5, jitter=0.1)
    who = [
        gate.decide(n, e, s) for n, e, s in zip(nov, trace["expert"], trace["state"], strict=True)
    ]
    expert_steps = [i for i, d in enumerate(who) if d.expert_in_control]
    # Divergent steps 10..14 plus k agreeing steps 15..18 belong to the expert; none other.
    assert expert_steps == list(range(10, 15 + k))
    assert who[10].reason == "divergence"
    assert who[15 + k - 1].reason == "handback"
    assert all(d.distance > 0.3 for d in who[10:15])
    assert all(d.distance <= 0.3 for d in who[:10])


def test_novice_handback_gives_the_kth_agreeing_step_back_to_the_novice(trace):
    # The single-task sync loop's rule (robofleet.app.sim.hgdagger.run): same takeover, the
    # handback step is the novice's and is not labelled.
    k = 4
    gate = HGDaggerGate(threshold=0.3, handback_steps=k, norm="linf", handback_step="novice")
    nov = novice_from(trace["expert"], range(10, 15), offset=0.5, jitter=0.1)
    who = [gate.decide(n, e) for n, e in zip(nov, trace["expert"], strict=True)]
    assert [i for i, d in enumerate(who) if d.expert_in_control] == list(range(10, 15 + k - 1))
    assert who[10].reason == "divergence"
    assert who[15 + k - 1].reason == "handback" and not who[15 + k - 1].expert_in_control
    assert not gate.expert_in_control


def test_disagreement_during_handback_restarts_the_count(trace):
    gate = HGDaggerGate(threshold=0.3, handback_steps=3, norm="linf")
    nov = novice_from(trace["expert"], [10, 13], offset=0.6, jitter=0.05)
    who = [gate.decide(n, e) for n, e in zip(nov, trace["expert"], strict=True)]
    expert_steps = [i for i, d in enumerate(who) if d.expert_in_control]
    # 10 diverges, 11-12 agree (2 < 3), 13 diverges again, 14-16 agree -> hand back at 16.
    assert expert_steps == list(range(10, 17))


def test_risk_region_forces_the_expert_even_when_novice_agrees(trace):
    hand_x = trace["state"][:, 0]
    lo, hi = float(np.sort(hand_x)[20]), float(hand_x.max())
    region = RiskRegion(dims=[0], low=[lo], high=[hi])
    gate = HGDaggerGate(threshold=0.3, handback_steps=1, risk_regions=[region])
    who = [gate.decide(e, e, s) for e, s in zip(trace["expert"], trace["state"], strict=True)]
    inside = (hand_x >= lo) & (hand_x <= hi)
    for i, d in enumerate(who):
        if inside[i]:
            assert d.expert_in_control and d.reason == "risk_region", i
    # With a perfect novice the expert leaves on the first step back outside (k = 1).
    for i in range(1, len(who)):
        if not inside[i] and not inside[i - 1]:
            assert not who[i].expert_in_control


def test_scripted_operator_returns_the_expert_label_when_it_takes_over(trace):
    from hal.drivers.metaworld import expert_policy

    expert = expert_policy("reach-v3")
    op = ScriptedOperator(expert, HGDaggerGate(threshold=0.2, handback_steps=2))
    obs = {"observation.state": trace["state"][5]}
    label = expert(obs)
    agree = op.step(obs, label.copy())
    assert not agree.is_intervention and agree.action is None
    off = op.step(obs, label + 1.0)
    assert off.is_intervention and np.array_equal(off.action, label)
    assert op.takeovers == 1
    op.reset()
    assert not op.gate.expert_in_control


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"threshold": 0.0, "handback_steps": 1}, "threshold"),
        ({"threshold": 0.1, "handback_steps": 0}, "handback_steps"),
        (
            {
                "threshold": 0.1,
                "handback_steps": 1,
                "risk_regions": [RiskRegion(dims=[0], low=[1.0], high=[0.0])],
            },
            "low exceeds high",
        ),
        (
            {
                "threshold": 0.1,
                "handback_steps": 1,
                "risk_regions": [RiskRegion(dims=[0, 1], low=[0.0], high=[1.0])],
            },
            "one entry each",
        ),
        ({"threshold": 0.1, "handback_steps": 1, "handback_step": "both"}, "handback_step"),
    ],
)
def test_bad_gate_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        HGDaggerGate(**kwargs)


def test_mismatched_action_shapes_are_refused():
    gate = HGDaggerGate(threshold=0.1, handback_steps=1)
    with pytest.raises(ValueError, match="differ"):
        gate.decide(np.zeros(4), np.zeros(3))
