"""Help requests on a simulated robot, through the real edge agent: one request per risky
stretch, hold vs continue while waiting, a takeover or a person's answer ends it, expiry,
the heartbeat carries it to the store with its wait; the help probe trained from the robot's
own steps, shipped in a weight version, asks before the person's takeover."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from cloud_learner.help_probe import fit_probe, head_activations, probe_labels
from cloud_learner.policies.base import PolicySpec
from cloud_learner.policies.mlp import MLPPolicy
from cloud_learner.policy_card import card_for, with_card
from comms.cloud.liveness import record_heartbeat
from edge_agent.core import OperatorInput
from edge_agent.help import HelpDesk, HelpSettings
from edge_agent.help_risk import ProbeRisk
from edge_agent.inference import LocalPolicyRunner
from edge_agent.policy_build import CardPolicy
from edge_agent.weights import StagedWeights
from foundation.store.help_requests import figures, recent_requests
from foundation.store.metadata_store import MetadataStore, upgrade
from foundation.store.models import Run
from tests.dashboard.helpers import add_robot
from tests.edge_agent.helpers import BiasPolicy, make_agent, spooled_rows
from tests.fakes.robot import PointRobot
from tests.fakes.settings import fast_edge


class ScheduleRisk:
    """A risk that follows ``schedule`` step by step, again each episode."""

    def __init__(self, schedule: Sequence[float]) -> None:
        self.schedule = list(schedule)
        self.calls = 0

    def risk(self, obs: Any, task: int, proposed: np.ndarray, fresh: bool) -> float | None:
        r = self.schedule[self.calls % len(self.schedule)]
        self.calls += 1
        return r

    def offer_weights(self, weights: Mapping[str, Any]) -> None:
        pass


class Hands:
    """An operator polled by the agent: takes over on its calls ``[start, start + steps)`` of
    an episode (None: never); counts its calls."""

    def __init__(self, start: int | None = None, steps: int = 0) -> None:
        self.start, self.steps, self.calls = start, steps, 0

    def step(self, observation: Any, proposed: np.ndarray) -> OperatorInput:
        n, self.calls = self.calls, self.calls + 1
        if self.start is not None and self.start <= n < self.start + self.steps:
            return OperatorInput(True, np.zeros(4, np.float32), None, "hands")
        return OperatorInput(False, None, None, "")

    def reset(self) -> None:
        self.calls = 0

    def close(self) -> None:
        pass


def _agent(tmp: Path, schedule: Sequence[float], steps: int, operator: Any = None, **help: Any):
    desk = HelpDesk(HelpSettings(risk="ensemble", **help), "robot-1")
    policy = BiasPolicy()
    policy.bias[0] = 0.5
    agent = make_agent(
        tmp,
        PointRobot(episode_steps=steps),
        policy,
        operator=operator,
        settings=fast_edge(control_hz=500.0),
        helpdesk=desk,
        risk=ScheduleRisk(schedule),
    )
    return agent, desk


def test_one_request_per_risky_stretch(tmp_path: Path) -> None:
    # threshold 0.7, hysteresis 0.2: the dip to 0.6 does not re-arm, the fall to 0.3 does.
    schedule = [0.1, 0.2, 0.9, 0.95, 0.6, 0.9, 0.3, 0.1, 0.8, 0.9, 0.2, 0.1]
    agent, desk = _agent(
        tmp_path,
        schedule,
        len(schedule),
        threshold=0.7,
        hysteresis=0.2,
        cooldown_steps=0,
        while_waiting="continue",
        timeout_s=0.001,
    )
    agent.run(episodes=2)
    keys = [r["key"] for r in desk.outbox()[0]]
    assert keys == ["robot-1:0:2", "robot-1:0:8", "robot-1:1:2", "robot-1:1:8"]
    assert all(r.outcome == "expired" for r in desk.requests)


def test_hold_waits_without_acting_until_expiry_continue_acts_on(tmp_path: Path) -> None:
    schedule = [0.0, 0.0, 0.0, 0.9] + [0.0] * 6
    hands = Hands()
    agent, desk = _agent(tmp_path / "hold", schedule, 10, hands, timeout_s=0.3)
    agent.run(episodes=1)
    req = desk.requests[0]
    assert (req.step, req.outcome) == (3, "expired")
    assert agent.report()["help_hold_s"] >= 0.29
    assert len(agent.driver.sent) == 10  # nothing was sent while holding
    assert hands.calls > 10 + 50  # the operator was polled every period while holding
    stamps = spooled_rows(agent.uplink.spool).column("timestamp").to_pylist()
    assert stamps[-1] < 0.25  # the hold is left out of the episode's clock

    hands = Hands()
    agent, desk = _agent(
        tmp_path / "go", schedule, 10, hands, timeout_s=30.0, while_waiting="continue"
    )
    t0 = time.monotonic()
    agent.run(episodes=1)
    assert time.monotonic() - t0 < 0.3 and agent.report()["help_hold_s"] == 0.0
    assert desk.waiting and desk.requests[0].outcome is None and hands.calls == 10


def _store(tmp: Path) -> tuple[MetadataStore, int]:
    url = f"sqlite:///{tmp}/m.db"
    upgrade(url)
    store = MetadataStore(url)
    with store.session() as s:
        s.add(Run(id="run-1", algorithm="hg-dagger"))
    return store, add_robot(store, "robot-1")


def test_takeover_ends_the_request_and_the_store_keeps_its_wait(tmp_path: Path) -> None:
    store, rid = _store(tmp_path)
    schedule = [0.0, 0.0, 0.9] + [0.0] * 17
    # Polled during the hold: the person arrives on the 30th poll and drives 5 steps.
    agent, desk = _agent(tmp_path, schedule, 20, Hands(start=30, steps=5), timeout_s=10.0)
    beats: list[dict[str, Any]] = []

    def heartbeat(state: str, version: int, stats: Any, info: Any = None) -> None:
        beats.append(info or {})
        record_heartbeat(store, rid, state, version, dict(stats), "run-1", info)

    agent.heartbeat = heartbeat
    agent.run(episodes=1)
    req = desk.requests[0] if desk.requests else None
    assert req is None or req.outcome == "took_over"  # delivered requests are let go
    assert any(b.get("help") for b in beats)
    [row] = recent_requests(store, "run-1")
    assert (row["outcome"], row["answered_by"], row["takeover_steps"]) == ("took_over", "Hands", 5)
    assert row["wait_s"] > 0.03  # about 28 polls of a 2 ms period
    rows = spooled_rows(agent.uplink.spool)
    assert sum(rows.column("is_intervention").to_pylist()) == 5
    assert figures(store, "run-1")["took_over"] == 1


def test_a_persons_answer_from_the_cloud_releases_the_hold(tmp_path: Path) -> None:
    schedule = [0.9] + [0.0] * 9
    agent, desk = _agent(tmp_path, schedule, 10, Hands(), timeout_s=30.0)

    def answer() -> None:
        while not desk.waiting:
            time.sleep(0.005)
        time.sleep(0.1)
        reason = {"key": "robot-1:0:0", "outcome": "dismissed", "by": "user:alice"}
        agent.control.handle("help_answered", json.dumps(reason))

    t = threading.Thread(target=answer)
    t.start()
    t0 = time.monotonic()
    agent.run(episodes=1)
    t.join()
    req = desk.requests[0]
    assert (req.outcome, req.by) == ("dismissed", "user:alice")
    assert 0.09 < time.monotonic() - t0 < 5.0 and len(agent.driver.sent) == 10


class TakesOverAt(Hands):
    """A person who takes over from step ``start`` of every episode to its end."""

    def __init__(self, start: int) -> None:
        super().__init__(start, 10_000)


def test_probe_trained_on_the_robots_steps_asks_before_the_takeover(tmp_path: Path) -> None:
    torch.manual_seed(0)
    policy = MLPPolicy(PolicySpec(3, 4, hidden=16))
    last = policy.head[-1]
    assert isinstance(last, torch.nn.Linear)
    with torch.no_grad():
        last.bias.copy_(torch.tensor([0.8, 0.3, 0.0, 0.0]))  # drifts steadily
    staged = StagedWeights()
    published = with_card(policy.get_weights(), card_for("hg_dagger", policy))
    staged.offer(1, published)
    runner = LocalPolicyRunner(CardPolicy(3, 4, 1, hidden=16, stochastic=False), 4)
    desk = HelpDesk(HelpSettings(risk="probe", threshold=0.5, while_waiting="continue"), "r")
    agent = make_agent(
        tmp_path,
        PointRobot(episode_steps=30),
        None,
        operator=TakesOverAt(20),
        runner=runner,
        weights=staged,
        settings=fast_edge(control_hz=1000.0),
        helpdesk=desk,
        risk=ProbeRisk(runner),
    )
    agent.run(episodes=1)
    assert desk.requests == []  # no probe shipped yet: no risk

    # The cloud's side: the episode's steps -> labels (takeover within K=5) -> activations.
    rows = spooled_rows(agent.uplink.spool)
    states = np.stack(rows.column("observation.state").to_numpy(zero_copy_only=False))
    acted = np.asarray(rows.column("is_intervention").to_pylist())
    labels, keep = probe_labels(acted, failed=False, horizon=5)
    assert labels[15:20].all() and not labels[:15].any() and not keep[20:].any()
    batch = {
        "observation.state": torch.as_tensor(states[keep].astype(np.float32)),
        "task_index": torch.zeros(int(keep.sum()), dtype=torch.long),
    }
    probe = fit_probe(head_activations(policy, batch), labels[keep], epochs=300)
    assert probe.info["accuracy"] >= 0.9
    staged.offer(2, {**published, **probe.to_tensors()})

    agent.run(episodes=1)
    [req] = desk.requests
    assert 12 <= req.step < 20 and req.episode == 1  # asked before the person stepped in
    assert (req.outcome, req.takeover_steps) == ("took_over", 10)


def test_a_beat_refused_with_reports_goes_again_without_them(tmp_path: Path) -> None:
    agent, desk = _agent(tmp_path, [0.9] + [0.0] * 4, 5, timeout_s=30.0, while_waiting="continue")
    agent.run(episodes=1)
    beats: list[Any] = []

    def heartbeat(state: str, version: int, stats: Any, info: Any = None) -> None:
        beats.append(info)
        if info is not None:
            raise RuntimeError("refused")

    agent.heartbeat = heartbeat
    agent._heartbeats.beat()  # logs the refusal, never raises
    assert beats[0]["help"][0]["key"] == "robot-1:0:0" and beats[1] is None
    assert len(desk.outbox()[0]) == 1  # still to send


def test_ensemble_risk_is_the_spread_of_the_applied_versions(tmp_path: Path) -> None:
    from edge_agent.help_risk import EnsembleRisk

    torch.manual_seed(0)
    policy = MLPPolicy(PolicySpec(3, 4, hidden=8))
    card = card_for("hg_dagger", policy)
    runner = LocalPolicyRunner(CardPolicy(3, 4, 1, hidden=8, stochastic=False), 4)
    risk = EnsembleRisk(runner, members=2)
    obs = {"observation.state": np.array([0.1, 0.2, 0.3], np.float32)}
    runner.set_weights(1, with_card(policy.get_weights(), card))
    risk.offer_weights({})
    first, _ = runner.act(obs, 0)
    assert risk.risk(obs, 0, first, fresh=True) is None  # one version: no ensemble yet
    moved = {k: v + 0.5 if k.startswith("head.") else v for k, v in policy.get_weights().items()}
    runner.set_weights(2, with_card(moved, card))
    risk.offer_weights({})
    runner.reset()
    second, _ = runner.act(obs, 0)
    got = risk.risk(obs, 0, second, fresh=True)
    want = float(np.clip(np.stack([second, first]).std(axis=0).mean(), 0, 1))
    assert got is not None and got == pytest.approx(want) and got > 0.01
    assert risk.risk(obs, 0, second, fresh=False) == got  # the chunk's steps share it


class SaysFailure(Hands):
    """A person who, polled while the robot waits, gives a failure verdict."""

    def step(self, observation: Any, proposed: np.ndarray) -> OperatorInput:
        self.calls += 1
        return OperatorInput(False, None, "failure" if self.calls > 3 else None, "")


def test_a_stop_ends_the_hold_without_acting_and_a_verdict_answers(tmp_path: Path) -> None:
    schedule = [0.0, 0.0, 0.9] + [0.0] * 7
    agent, desk = _agent(tmp_path / "stop", schedule, 10, Hands(), timeout_s=30.0)
    threading.Timer(0.2, agent.stop).start()
    agent.run(episodes=1)
    assert len(agent.driver.sent) == 2  # the held step 2 never acted
    assert desk.waiting and agent.report()["help_hold_s"] >= 0.15

    agent, desk = _agent(tmp_path / "verdict", schedule, 10, SaysFailure(), timeout_s=30.0)
    agent.run(episodes=1)
    req = desk.requests[0]
    assert (req.outcome, req.by, req.label) == ("dismissed", "SaysFailure", "failure")
    assert len(agent.driver.sent) == 3  # the verdict's step ends the episode


def test_the_runs_help_section_builds_the_agents_desk_and_risk(tmp_path: Path) -> None:
    from edge_agent.build import AgentOptions, build_agent
    from edge_agent.help_risk import EnsembleRisk

    def built(name: str, help: dict[str, Any]) -> Any:
        opts = AgentOptions(
            robot_name=name, tasks=["reach-v3"], driver="metaworld", operator="none",
            max_episode_steps=2, spool_dir=tmp_path / name, help=help,
        )  # fmt: skip
        return build_agent(fast_edge(control_hz=1000.0), None, opts)

    asks = built("asks", {"risk": "ensemble", "threshold": 0.3, "from_a_newer_cloud": 1})
    never = built("never", {})
    try:
        assert isinstance(asks.agent.risk, EnsembleRisk)
        assert asks.agent.helpdesk is not None and asks.agent.helpdesk.settings.threshold == 0.3
        assert never.agent.helpdesk is None and never.agent.risk is None
        assert asks.agent.control.on_help == asks.agent.helpdesk.answered
    finally:
        asks.close()
        never.close()
