"""A run's human cost (runs.human_cost): figures from known robot statistics, the report built
from a real edge agent's report, and a robot paused by its own reset timeout left alone by the
run's pause/resume."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from foundation.runspec import parse_run_spec
from foundation.store.metadata_store import MetadataStore, upgrade
from foundation.store.models import Robot
from runs.hold import RobotHold
from runs.human_cost import human_cost, text_table
from runs.report import write_report
from tests.edge_agent.helpers import BiasPolicy, make_agent
from tests.fakes.robot import PointRobot

ARM_A = {
    "human/reach/takeover_s": 30.0,
    "human/reach/labels": 4.0,
    "human/reach/reset_s": 600.0,
    "human/reach/resets": 10.0,
    "human/reach/episode_s": 1800.0,  # half an hour of autonomous episodes
    "human/reach/autonomous_reset_s": 360.0,  # and 6 minutes of resets after them
    "autonomous/reach/episodes": 10.0,
    "autonomous/reach/successes": 6.0,
    "eval/reach/successes": 99.0,  # not a human cost
    "steps": 1000.0,
}
ARM_B = {
    "human/reach/episode_s": 1800.0,
    "autonomous/reach/episodes": 5.0,
    "autonomous/reach/successes": 3.0,
    "human/push/takeover_s": 12.5,
    "human/push/labels": 2.0,
}


def test_successes_per_hour_with_and_without_resets_from_known_figures() -> None:
    cost = human_cost({"arm-a": ARM_A, "arm-b": ARM_B, "idle": {"steps": 3.0}})
    a = cost["robots"]["arm-a"]["reach"]
    assert (a["takeover_s"], a["labels"], a["resets"], a["reset_s"]) == (30.0, 4.0, 10.0, 600.0)
    assert a["successes_per_hour_excl_resets"] == pytest.approx(12.0)  # 6 / 0.5 h
    assert a["successes_per_hour_incl_resets"] == pytest.approx(10.0)  # 6 / 0.6 h
    b = cost["robots"]["arm-b"]
    assert b["reach"]["successes_per_hour_excl_resets"] == pytest.approx(6.0)
    assert b["reach"]["successes_per_hour_incl_resets"] == pytest.approx(6.0)  # no resets
    assert b["push"]["successes_per_hour_excl_resets"] is None  # no autonomous time
    assert b["push"]["takeover_s"] == 12.5 and b["push"]["labels"] == 2.0
    reach = cost["tasks"]["reach"]
    assert reach["autonomous_successes"] == 9.0 and reach["episode_s"] == 3600.0
    assert reach["successes_per_hour_excl_resets"] == pytest.approx(9.0)
    assert reach["successes_per_hour_incl_resets"] == pytest.approx(9 / (3960 / 3600))
    total = cost["total"]
    assert total["takeover_s"] == 42.5 and total["labels"] == 6.0
    assert "idle" not in cost["robots"]
    table = text_table(cost)
    assert "arm-a" in table and "all tasks" in table and "12.0" in table and "10.0" in table


class Person:
    """Signals ready 0.2 s after each reset begins."""

    def __init__(self) -> None:
        self.begun = 0.0

    def step(self, observation: Any, proposed: Any) -> Any:
        from edge_agent.core import OperatorInput

        return OperatorInput()

    def reset(self) -> None:
        pass

    def close(self) -> None:
        pass

    def reset_begins(self) -> None:
        self.begun = time.monotonic()

    def ready(self) -> bool:
        return time.monotonic() - self.begun >= 0.2


def test_the_reset_time_of_an_agent_reaches_the_run_report(tmp_path: Path) -> None:
    driver = PointRobot(episode_steps=5, can_reset=False)
    agent = make_agent(tmp_path / "robot", driver, BiasPolicy(), operator=Person())
    final = agent.run(episodes=3)
    assert final["human/reach-v3/resets"] == 2.0
    spec = parse_run_spec(
        {"algorithm": "hg-dagger", "tasks": ["reach-v3"], "robots": {"robot_type": "x"}}
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_report(
        run_dir,
        "run-1",
        spec,
        learner_restarts=0,
        accounts={},
        elapsed_s=60.0,
        robot_reports={"arm-1": final},
    )
    report = json.loads((run_dir / "report.json").read_text())
    got = report["human_cost"]["robots"]["arm-1"]["reach-v3"]
    assert got["resets"] == 2.0 and got["reset_s"] == pytest.approx(final["human/reach-v3/reset_s"])
    assert got["reset_s"] >= 0.4 and got["autonomous_successes"] == 0.0
    assert got["successes_per_hour_incl_resets"] == 0.0
    text = (run_dir / "report.txt").read_text()
    assert "arm-1" in text and "reach-v3" in text and "resets" in text


class Pushes:
    def __init__(self) -> None:
        self.kinds: list[tuple[int, str]] = []

    def push_control(self, robot_id: int, kind: str, run_id: str = "", reason: str = "") -> bool:
        self.kinds.append((robot_id, kind))
        return True


def test_a_robot_paused_by_its_reset_timeout_is_not_resumed_by_the_run(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/meta.db"
    upgrade(url)
    store = MetadataStore(url)
    beats = {
        "held": {"state": "paused", "run_id": "run-1", "reset_paused": 1.0},
        "paused": {"state": "paused", "run_id": "run-1", "reset_paused": 0.0},
    }
    with store.session() as s:
        for name, stats in beats.items():
            s.add(Robot(name=name, robot_type="x", stats=stats))
    with store.session() as s:
        ids = {r.name: r.id for r in s.query(Robot)}
    server = Pushes()
    hold = RobotHold(store, server, "run-1", resend_s=0.0)
    try:
        assert hold.states(ids) == {"held": "resetting", "paused": "paused"}
        assert hold.follow(ids) == ["paused"]
        assert server.kinds == [(ids["paused"], "resume")]  # the run's own pause, undone
    finally:
        store.close()
