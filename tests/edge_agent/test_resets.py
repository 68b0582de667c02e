"""Resets by people (edge_agent.resets) and the human cost a robot counts (edge_agent.human_cost).

The robot is the suite's point robot declared ``can_reset: false``: its ``reset`` leaves the
point where the last episode left it, as an arm's driver does.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from comms.cloud.step_sink import MemorySink
from edge_agent.control import listen
from edge_agent.core import OperatorInput
from tests.edge_agent.helpers import BiasPolicy, make_agent
from tests.fakes.cloud import RUN, Cloud, migrated_store
from tests.fakes.procs import wait_until
from tests.fakes.robot import PointRobot
from tests.fakes.settings import fast_edge

TASK = "reach-v3"


def start(agent: Any, episodes: int) -> threading.Thread:
    runner = threading.Thread(target=agent.run, kwargs={"episodes": episodes}, name="agent")
    runner.start()
    return runner


def held_after(agent: Any, episodes: int) -> None:
    wait_until(lambda: agent.stats.episodes == episodes, 10, f"episode {episodes} ended")
    wait_until(lambda: agent.heartbeat_state == "resetting", 5, "the reset hold")


def test_a_robot_a_person_resets_waits_for_ready_between_episodes(tmp_path: Path) -> None:
    driver = PointRobot(episode_steps=5, can_reset=False)
    agent = make_agent(tmp_path, driver, BiasPolicy())
    runner = start(agent, 2)
    # the first episode needs no ready (the cell was set up before the agent started)
    held_after(agent, 1)
    time.sleep(0.3)
    assert len(driver.sent) == 5, "an action was sent while the robot waited for its reset"
    assert agent.next_episode_index == 1 and agent.stats.episodes == 1
    assert runner.is_alive()
    agent.ready("test operator")
    runner.join(10)
    assert not runner.is_alive()
    assert len(driver.sent) == 10 and agent.stats.episodes == 2
    report = agent.report()
    assert report[f"human/{TASK}/resets"] == 1.0
    assert 0.3 <= report[f"human/{TASK}/reset_s"] < 5.0
    assert report["reset_paused"] == 0.0 and report["reset_timeouts"] == 0.0
    assert report["control_ready"] == 1.0


def test_a_ready_given_during_the_episode_does_not_count(tmp_path: Path) -> None:
    driver = PointRobot(episode_steps=40, can_reset=False)
    agent = make_agent(tmp_path, driver, BiasPolicy(), settings=fast_edge(control_hz=100.0))
    runner = start(agent, 2)
    wait_until(lambda: agent.stats.steps >= 2, 10, "two steps")
    agent.ready("too early")
    held_after(agent, 1)
    time.sleep(0.2)
    assert agent.stats.episodes == 1 and len(driver.sent) == 40
    agent.ready("after the episode")
    runner.join(10)
    assert not runner.is_alive() and agent.stats.episodes == 2


def test_robots_that_reset_themselves_never_wait(tmp_path: Path) -> None:
    driver = PointRobot(episode_steps=5)
    agent = make_agent(tmp_path, driver, BiasPolicy())
    seen: list[str] = []
    agent.heartbeat = lambda state, _v, _s: seen.append(state)
    agent._heartbeats.interval_s = 0.001
    report = agent.run(episodes=3)
    assert len(driver.sent) == 15 and "resetting" not in seen
    assert not any(k.endswith("/resets") or k.endswith("/reset_s") for k in report)


def test_a_reset_timeout_pauses_the_robot_and_estop_and_stop_still_work(tmp_path: Path) -> None:
    driver = PointRobot(episode_steps=5, can_reset=False)
    beats: list[str] = []
    agent = make_agent(tmp_path, driver, BiasPolicy(), settings=fast_edge(reset_timeout_s=0.2))
    agent.heartbeat = lambda state, _v, _s: beats.append(state)
    runner = start(agent, 3)
    held_after(agent, 1)
    wait_until(lambda: agent.heartbeat_state == "paused", 5, "paused by the reset timeout")
    assert "paused" in beats  # told to the cloud at once
    assert agent.report()["reset_paused"] == 1.0 and agent.control.paused is False
    # an e-stop while holding latches the robot; cleared, it goes on waiting for ready
    agent.control.handle("estop", "test")
    wait_until(lambda: agent.heartbeat_state == "estopped", 5, "estopped")
    assert driver.is_estopped
    agent.clear_estop()
    wait_until(lambda: agent.heartbeat_state in ("resetting", "paused"), 5, "holding again")
    time.sleep(0.1)
    assert len(driver.sent) == 5
    agent.ready()
    held_after(agent, 2)  # a fresh reset: not paused until its own timeout
    report = agent.report()
    assert report["reset_timeouts"] >= 1.0 and report[f"human/{TASK}/resets"] == 1.0
    agent.stop()  # a stop ends a hold at once
    runner.join(5)
    assert not runner.is_alive() and len(driver.sent) == 10 and agent.heartbeat_state == "stopped"


class Person:
    """A scripted person: takes over every step of episode 0, labels episode 1 a success at
    its 3rd step, leaves episode 2 to the policy; signals ready ``delay_s`` after a reset
    begins."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.episode = -1
        self.steps = 0
        self.begun_at: float | None = None

    def step(self, observation: Any, proposed: np.ndarray) -> OperatorInput:
        self.steps += 1
        if self.episode == 0:
            return OperatorInput(True, np.zeros(4, np.float32), None, "fixed")
        if self.episode == 1 and self.steps == 3:
            return OperatorInput(False, None, "success", "")
        return OperatorInput()

    def reset(self) -> None:
        self.episode += 1
        self.steps = 0

    def close(self) -> None:
        pass

    def reset_begins(self) -> None:
        self.begun_at = time.monotonic()

    def ready(self) -> bool:
        return self.begun_at is not None and time.monotonic() - self.begun_at >= self.delay_s


def test_human_cost_counts_takeovers_labels_resets_and_autonomous_time(tmp_path: Path) -> None:
    driver = PointRobot(episode_steps=5, can_reset=False)
    hz = 100.0
    person = Person(delay_s=0.1)
    agent = make_agent(
        tmp_path, driver, BiasPolicy(), operator=person, settings=fast_edge(control_hz=hz)
    )
    report = agent.run(episodes=3)
    period = 1.0 / hz
    assert report[f"human/{TASK}/takeover_s"] == pytest.approx(5 * period)
    assert report[f"human/{TASK}/labels"] == 1.0
    assert report[f"human/{TASK}/resets"] == 2.0  # before episodes 1 and 2, not before 0
    assert 0.2 <= report[f"human/{TASK}/reset_s"] < 2.0
    # autonomous: episode 1 (3 steps, ended by the verdict) and episode 2 (5 steps)
    assert report[f"human/{TASK}/episode_s"] == pytest.approx(8 * period)
    assert report[f"autonomous/{TASK}/episodes"] == 2.0
    assert report[f"autonomous/{TASK}/successes"] == 1.0
    # only the reset after episode 1 (autonomous) follows an autonomous episode
    assert 0.1 <= report[f"human/{TASK}/autonomous_reset_s"] < report[f"human/{TASK}/reset_s"]


def test_the_dashboards_ready_reaches_a_held_robot(tmp_path: Path) -> None:
    """The cloud's ``ready`` (what the dashboard's Ready button pushes) over the real Control
    stream releases a robot holding for its reset."""
    store = migrated_store(f"sqlite:///{tmp_path}/meta.db", RUN)
    driver = PointRobot(episode_steps=5, can_reset=False)
    agent = make_agent(tmp_path, driver, BiasPolicy())
    with Cloud(store, MemorySink()) as cloud:
        robot = cloud.robot("arm-1")
        client = cloud.client(robot)
        listener = listen(client, agent.control)
        try:
            runner = start(agent, 2)
            held_after(agent, 1)
            wait_until(
                lambda: cloud.server.push_control(robot.robot_id, "ready", RUN, "dashboard: op"),
                10,
                "ready delivered",
            )
            runner.join(10)
            assert not runner.is_alive() and agent.stats.episodes == 2
            assert len(driver.sent) == 10 and agent.report()["control_ready"] == 1.0
        finally:
            listener.close()
            client.close()
    store.close()


def test_the_simulated_person_resets_a_blind_meta_world_robot(tmp_path: Path) -> None:
    """A Meta-World robot that does not reset itself holds until the simulated person has put
    the scene back (``ready_after_s``); its verdicts count as a person's labels."""
    from edge_agent.gating import HGDaggerGate
    from edge_agent.operators import ScriptedOperator
    from edge_agent.simulated_person import SimulatedPerson
    from hal.drivers.metaworld import MetaWorldDriver, expert_policy

    steps = 20
    driver = MetaWorldDriver(
        "blind-1",
        tasks=[TASK],
        max_episode_steps=steps,
        reward="none",
        detects_success=False,
        self_reset=False,
    )
    hands = ScriptedOperator(
        expert_policy(TASK),
        HGDaggerGate(threshold=0.3, handback_steps=5),
        bounds=(np.full(4, -1, np.float32), np.ones(4, np.float32)),
    )
    person = SimulatedPerson(hands, lambda: False, steps, ready_after_s=0.3)
    agent = make_agent(
        tmp_path, driver, BiasPolicy(), operator=person, settings=fast_edge(control_hz=1000.0)
    )
    report = agent.run(episodes=2)
    assert agent.stats.episodes == 2
    assert report[f"human/{TASK}/resets"] == 1.0
    assert 0.3 <= report[f"human/{TASK}/reset_s"] < 3.0
    assert report[f"human/{TASK}/labels"] == float(person.labels) == 2.0  # two failures
