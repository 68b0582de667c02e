"""An operator's rerecord or discard is never trained on (issue 16, finding 2).

A real agent (``build_agent`` on the suite's fake robot, the default ``episode_commit:
stream``) streams to a real cloud and replay buffer. Its operator presses ``r`` (rerecord) in
one episode and ``x`` (discard) in another, and the cloud pushes a discard over the robot's
Control stream in a third: the buffer keeps each as a mark, no sampler returns a row of those
episodes, they are counted, they do not count toward ``run(episodes=N)`` and a rerecorded
episode's task is recorded again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from buffer import samplers
from edge_agent.credential import RobotCredential, write_credential
from edge_agent.operators import KeyboardOperator
from tests.fakes.cloud import RUN
from tests.fakes.procs import wait_until
from tests.fakes.settings import fast_comms, fast_edge

STEPS = 40  # per episode
PRESS_AT = 10  # frame of an episode at which the operator acts


class Key:
    def __init__(self, char: str) -> None:
        self.char = char


class Operator(KeyboardOperator):
    """A keyboard operator (no listener) who presses ``keys[episode]`` at frame ``PRESS_AT``
    of that episode, and in episode ``cloud_at`` has the cloud push a discard (``push``),
    holding the step until the command is there."""

    def __init__(self, keys: dict[int, str], cloud_at: int, push: Any, pending: Any) -> None:
        super().__init__(4, listen=False)
        self.keys, self.cloud_at, self.push, self.pending = keys, cloud_at, push, pending
        self.episode, self.frame = -1, 0

    def reset(self) -> None:
        super().reset()
        self.episode, self.frame = self.episode + 1, 0

    def step(self, observation: Any, proposed: np.ndarray) -> Any:
        if self.frame == PRESS_AT and self.episode in self.keys:
            self.on_press(Key(self.keys[self.episode]))
        if self.frame == PRESS_AT and self.episode == self.cloud_at:
            wait_until(lambda: self.push("discard"), 10, "the robot's Control stream")
            wait_until(self.pending, 10, "the cloud's discard at the robot", poll_s=0.005)
        self.frame += 1
        return super().step(observation, proposed)


@pytest.mark.slow
def test_rerecord_and_discard_in_stream_mode_are_never_sampled(
    tmp_path: Path, db: Any, monkeypatch
):
    from edge_agent.build import AgentOptions, build_agent
    from hal.drivers import DRIVER_KINDS
    from tests.fakes import point_agent

    monkeypatch.setitem(DRIVER_KINDS, point_agent.KIND, point_agent.DRIVER)
    _url, store = db
    buf, cloud = point_agent.cloud_on_buffer(store, tmp_path / "buffer")
    built = None
    try:
        robot = cloud.robot("point-ops")
        spool = tmp_path / "spool"
        write_credential(spool, RobotCredential(robot.robot_id, robot.credential))
        opts = AgentOptions(
            robot_name="point-ops",
            tasks=["reach", "push"],
            run_id=RUN,
            server=cloud.address,
            operator="none",
            max_episode_steps=STEPS,
            spool_dir=spool,
            driver=point_agent.KIND,
            driver_options={"count_file": str(tmp_path / "executed")},
        )
        edge = fast_edge(control_hz=200.0, wait_for_first_weights=False)
        assert edge.episode_commit == "stream"
        built = build_agent(edge, fast_comms(), opts)
        agent = built.agent

        def push(kind: str) -> bool:
            return cloud.server.push_control(robot.robot_id, kind, RUN, "test")

        agent.operator = Operator({0: "r", 2: "x"}, 3, push, lambda: agent.control.pending)
        report = agent.run(episodes=3)
        assert agent.uplink.wait_acked(30)
        wait_until(lambda: buf.stats().get("discarded_episodes") == 3, 20, "the episode marks")

        # Three kept episodes were run; the three thrown away were not counted toward them.
        assert report["discarded_episodes"] == 3
        idx = buf.index
        li = np.arange(buf.first_row, buf.visible) - idx.base
        episode = idx.cols["episode_index"][li]
        assert sorted(set(episode.tolist())) == [0, 1, 2, 3, 4, 5]
        gone = np.isin(episode, [0, 2, 3])
        # The rerecorded episode's task is recorded again, then the schedule goes on.
        task = np.asarray(idx.tasks.names)[idx.cols["task"][li]]
        assert task[episode == 1][0] == task[episode == 0][0] == "reach"
        stats = buf.stats()
        assert stats["rerecorded_episodes"] == 1
        assert stats["discarded_steps"] == int(gone.sum()) == 3 * (PRESS_AT + 1)
        # Never sampled, by any sampler, nor counted as transitions or selected.
        assert len(buf) == 3 * STEPS
        assert not np.isin(buf.select() - idx.base, li[gone]).any()
        rng = np.random.default_rng(0)
        for sampler in (
            samplers.UniformSampler(),
            samplers.PrioritizedSampler(),
            samplers.RecencySampler(window=10_000),
            samplers.MixSampler(prior="interventions"),
        ):
            batch = buf.sample(512, sampler=sampler, rng=rng)
            assert not np.isin(batch["episode_index"], [0, 2, 3]).any(), sampler
        # Each kept episode's outcome reached the buffer through the same outbox.
        wait_until(lambda: len(idx.outcomes) == 3, 20, "the kept episodes' outcomes")
        assert sorted(k[2] for k in idx.outcomes) == [1, 4, 5]
        assert not agent.marks.pending()
    finally:
        if built is not None:
            built.close()
        cloud.close()
        buf.close()
