"""A chunk policy never continues a chunk planned before a person touched the robot or the
cloud paused it: the next action is a fresh inference on the current observation."""

from __future__ import annotations

import threading

import numpy as np

from edge_agent.core import OperatorInput
from tests.edge_agent.helpers import make_agent, spooled_rows
from tests.fakes.robot import PointRobot

CHUNK = 6


class CountingChunks:
    """Chunks whose rows say which call made them and which row they are:
    ``[call, row, 0, 0]``, so a stored action tells when it was planned."""

    def __init__(self) -> None:
        self.calls = 0
        self.frames_at_call: list[int] = []

    def act(self, observation, task):
        self.calls += 1
        rows = np.zeros((CHUNK, 4), np.float32)
        rows[:, 0] = self.calls / 100.0
        rows[:, 1] = np.arange(CHUNK) / 100.0
        return rows

    def get_weights(self):
        return {}

    def set_weights(self, weights):
        pass


class TakeOver:
    """Takes over on ``frames`` (0-based steps of the episode); ``on_frame`` runs at a frame."""

    def __init__(self, frames: set[int], on_frame=None) -> None:
        self.frames, self.frame, self.on_frame = frames, 0, on_frame or {}

    def step(self, observation, proposed):
        f, self.frame = self.frame, self.frame + 1
        if f in self.on_frame:
            self.on_frame[f]()
        if f in self.frames:
            return OperatorInput(True, np.full(4, 0.5, np.float32), None, "test")
        return OperatorInput()

    def reset(self) -> None:
        self.frame = 0

    def close(self) -> None:
        pass


def _planned(rows) -> list[tuple[int, int]]:
    """(call, row) of what the policy proposed at each stored step."""
    executed = np.stack(rows.column("action").to_numpy(zero_copy_only=False))
    proposed = [
        executed[i] if p is None else np.asarray(p)
        for i, p in enumerate(rows.column("action.policy").to_pylist())
    ]
    return [(round(float(p[0]) * 100), round(float(p[1]) * 100)) for p in proposed]


def test_after_a_takeover_the_policy_plans_afresh(tmp_path):
    policy = CountingChunks()
    agent = make_agent(tmp_path, PointRobot(episode_steps=12), policy, operator=TakeOver({2, 3}))
    agent.run(episodes=1)
    planned = _planned(spooled_rows(agent.uplink.spool))
    # frames 0-2 come from chunk 1 (the takeover starts at frame 2, decided on its
    # proposal); frame 3's proposal and frame 4's action are each a fresh chunk's first row
    assert planned[:5] == [(1, 0), (1, 1), (1, 2), (2, 0), (3, 0)]
    assert planned[5:8] == [(3, 1), (3, 2), (3, 3)]


def test_after_a_pause_the_policy_plans_afresh(tmp_path):
    policy = CountingChunks()
    holder: dict = {}

    def pause() -> None:
        agent = holder["agent"]
        agent.control.handle("pause", "test")
        threading.Timer(0.2, agent.control.handle, args=("resume", "test")).start()

    agent = make_agent(
        tmp_path, PointRobot(episode_steps=8), policy, operator=TakeOver(set(), {2: pause})
    )
    holder["agent"] = agent
    agent.run(episodes=1)
    planned = _planned(spooled_rows(agent.uplink.spool))
    # paused while frame 2 ran: frame 3 starts after the pause with a fresh chunk
    assert planned[:5] == [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1)]
