"""An edge agent SIGKILLed in the middle of an episode (issue 16, finding 9).

A real agent process (``tests.fakes.point_agent``: ``build_agent`` on the suite's fake robot,
the agent's default batching) streams to a real cloud and replay buffer; it is SIGKILLed
halfway between two of its upload batches and started again on the same spool. Every step it
had taken must be in the buffer but for the last moment's (the step in flight and the row held
for its successor), and the interrupted episode must be closed as truncated once the robot
is back, so its transitions carry a done step like any other episode's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge_agent.credential import RobotCredential, write_credential
from tests.fakes.cloud import RUN, Cloud
from tests.fakes.point_agent import cloud_on_buffer
from tests.fakes.procs import Child, python_module, wait_until

HZ = 100
BATCH = 20  # the agent's default batch_max_steps


def _agent(cloud: Cloud, spool: Path, episodes: int, steps: int, count: Path) -> Child:
    return Child(
        python_module(
            "tests.fakes.point_agent",
            cloud.address,
            str(spool),
            RUN,
            str(episodes),
            str(steps),
            str(HZ),
            str(count),
        )
    )


def _executed(path: Path) -> int:
    """Actions the agent's robot executed so far (one byte each)."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


@pytest.mark.slow
def test_an_agent_killed_mid_episode_keeps_its_steps_and_the_episode_is_closed(tmp_path, db):
    _url, store = db
    buf, cloud = cloud_on_buffer(store, tmp_path / "buffer")
    spool, count = tmp_path / "spool", tmp_path / "executed"
    try:
        robot = cloud.robot("point-agent")
        write_credential(spool, RobotCredential(robot.robot_id, robot.credential))
        first = _agent(cloud, spool, 0, 100_000, count)
        assert first.line(120) == "running"
        # Rows go to the uplink one step late and a batch is cut every BATCH rows: at
        # BATCH * k + BATCH // 2 + 1 executed steps, half a batch is not cut yet.
        wait_until(
            lambda: _executed(count) > 8 * BATCH and _executed(count) % BATCH == BATCH // 2 + 1,
            60,
            "the agent's steps",
            poll_s=0.0005,
        )
        first.kill()
        executed = _executed(count)
        again = _agent(cloud, spool, 1, 20, tmp_path / "executed-again")
        assert again.line(120) == "running"
        assert again.proc.wait(120) == 0, "the restarted agent did not drain its spool"

        idx, rid = buf.index, str(robot.robot_id)
        lo, hi = buf.first_row - idx.base, buf.visible - idx.base
        mine = idx.cols["robot"][lo:hi] == idx.robots.codes[rid]
        rows = np.flatnonzero(mine) + lo + idx.base
        li = rows - idx.base
        episode = idx.cols["episode_index"][li]
        frames = idx.cols["frame_index"][li]
        trunc = idx.cols["truncated"][li]
        killed = episode == 0
        m = int(killed.sum())
        assert frames[killed].tolist() == list(range(m))
        # Durable in the spool at once: only the step in flight, the row held for its
        # successor and one being written are lost.
        assert m >= executed - 3, f"{executed} steps taken, {m} stored"
        # Closed when the robot came back: its last transition (whose successor is the last
        # stored step) is the episode's done step; the last step, whose outcome was never
        # observed, is no transition.
        assert frames[killed & trunc].tolist() == [m - 2]
        last_two = rows[killed][-2:]
        assert idx.cols["eligible"][li[killed]].tolist() == [True] * (m - 1) + [False]
        got = buf.read_transitions(last_two[:1], count=False)
        assert bool(got["truncated"][0]) and not bool(got["terminated"][0])
        final = buf.storage.gather(last_two[1:], ["observation.state"], count=False)
        np.testing.assert_array_equal(
            got["next.observation.state"][0], final["observation.state"][0]
        )
        after = episode == 1
        assert frames[after].tolist() == list(range(20))
        assert frames[after & trunc].tolist() == [19]
    finally:
        cloud.close()
        buf.close()
