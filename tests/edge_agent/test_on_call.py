"""A simulated person on call (the run has fewer people than robots): through the real edge
agent, it drives only once the cloud assigned someone to the robot's help request, for its
bounded steps, then hands back, and the request reports itself closed."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent.core import OperatorInput
from edge_agent.on_call import OnCallPerson
from edge_agent.simulated_person import SimulatedPerson
from tests.edge_agent.helpers import spooled_rows
from tests.edge_agent.test_help_requests import _agent


class Expert:
    """The scripted expert's part: it would take over at every step if asked through the
    gate (``step``); a demonstration drives with a fixed action."""

    def __init__(self) -> None:
        self.gated_calls = 0

    def step(self, observation: Any, proposed: np.ndarray) -> OperatorInput:
        self.gated_calls += 1
        return OperatorInput(True, np.ones(4, np.float32), None, "gate")

    def demonstrate(self, observation: Any) -> OperatorInput:
        return OperatorInput(True, np.ones(4, np.float32), None, "demonstration")

    def reset(self) -> None:
        pass

    def close(self) -> None:
        pass


def _run(tmp: Path, answer: bool) -> tuple[Any, Any, Expert]:
    schedule = [0.0, 0.0, 0.9] + [0.0] * 57
    expert = Expert()
    person = SimulatedPerson(expert, lambda: False, None)  # type: ignore[arg-type]
    agent, desk = _agent(
        tmp, schedule, 60, None, while_waiting="continue", timeout_s=30.0, cooldown_steps=100
    )
    agent.operator = OnCallPerson(person, desk, max_steps=4)

    def assign() -> None:  # the cloud assigned operator-1, who takes the robot over
        while not desk.waiting:
            time.sleep(0.001)
        reason = {"key": "robot-1:0:2", "outcome": "took_over", "by": "simulated-operator-1"}
        agent.control.handle("help_answered", json.dumps(reason))

    t = threading.Thread(target=assign)
    if answer:
        t.start()
    agent.run(episodes=1)
    if answer:
        t.join()
    return agent, desk, expert


def test_the_on_call_person_acts_only_while_assigned(tmp_path: Path) -> None:
    agent, desk, expert = _run(tmp_path / "unanswered", answer=False)
    flags = spooled_rows(agent.uplink.spool).column("is_intervention").to_pylist()
    assert len(flags) == 60 and not any(flags)  # asked, never assigned: nobody acted
    assert desk.requests[0].outcome is None and expert.gated_calls == 0

    agent, desk, expert = _run(tmp_path / "assigned", answer=True)
    flags = spooled_rows(agent.uplink.spool).column("is_intervention").to_pylist()
    taken = [i for i, f in enumerate(flags) if f]
    assert len(taken) == 4 and taken == list(range(taken[0], taken[0] + 4))
    assert taken[0] > 2  # after the request (step 2) was assigned
    [req] = desk.requests
    assert (req.outcome, req.by, req.takeover_steps) == ("took_over", "simulated-operator-1", 4)
    assert req.closed_at is not None and not desk.assigned  # handed back: the cloud frees
    assert agent.operator.takeovers == 1 and expert.gated_calls == 0
