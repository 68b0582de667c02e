"""Cloud control reaching a running edge agent: e-stop, pause, resume.

The end-to-end test runs comms' real gRPC server on loopback in front of a real replay buffer
and a real agent on a simulated Meta-World robot with the scripted operator; the cloud pushes
commands the way the dashboard's e-stop does (``CloudServer.push_control``).
"""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import select

from comms.cloud.replay_buffer_sink import ReplayBufferSink
from edge_agent.build import AgentOptions, build_agent
from edge_agent.control import CloudControl
from foundation.store.models import Event, Robot, RobotStatus
from tests.edge_agent.helpers import BiasPolicy, make_agent, spooled_rows
from tests.fakes.cloud import RUN, Cloud, metaworld_schema
from tests.fakes.procs import wait_until
from tests.fakes.robot import PointRobot
from tests.fakes.settings import fast_comms, fast_edge

HZ = 20.0
PERIOD = 1.0 / HZ


def wait_for(cond: Any, timeout: float, what: str) -> None:
    """Polled every 5 ms: the e-stop's latency is measured around these waits."""
    wait_until(cond, timeout, what, poll_s=0.005)


def push(cloud: Cloud[ReplayBufferSink], robot_id: int, kind: str) -> None:
    """Push once the robot's Control stream is registered (it connects in the background)."""
    send = cloud.server.push_control
    wait_for(lambda: send(robot_id, kind, RUN, "test"), 10, f"{kind} delivered")


@pytest.mark.slow
def test_cloud_estop_pause_resume_reach_a_running_agent(tmp_path: Path, db: Any) -> None:
    from buffer.table.replay_buffer import ReplayBuffer

    _url, store = db
    buf = ReplayBuffer.open(tmp_path / "buffer", metaworld_schema())
    cloud = Cloud(store, ReplayBufferSink(buf))
    built = None
    try:
        edge = fast_edge(
            control_hz=HZ,
            batch_max_steps=8,
            wait_for_first_weights=False,  # this cloud publishes no policy
        )
        opts = AgentOptions(
            robot_name="sawyer-ctl",
            tasks=["reach-v3"],
            driver="metaworld",
            run_id=RUN,
            server=cloud.address,
            token=store.create_enrollment_token(timedelta(minutes=5)),
            operator="scripted",
            max_episode_steps=50,
            spool_dir=tmp_path / "spool",
        )
        built = build_agent(edge, fast_comms(), opts)
        robot_id = json.loads((tmp_path / "spool" / "credential.json").read_text())["robot_id"]
        store.lease_robots(RUN, [robot_id])
        agent, driver, spool = built.agent, built.agent.driver, built.agent.uplink.spool
        # Measurement only: when did the robot really execute each action?
        executed_at: list[float] = []
        send = driver.send_action

        def timed_send(action: Any) -> Any:
            out = send(action)
            executed_at.append(time.monotonic())
            return out

        driver.send_action = timed_send  # type: ignore[method-assign]
        runner = threading.Thread(target=agent.run, name="agent")
        runner.start()

        # --- e-stop in the middle of the first episode
        wait_for(lambda: agent.stats.steps >= 20, 30, "20 steps")
        pushed = time.monotonic()
        push(cloud, robot_id, "estop")
        wait_for(lambda: agent.control.estop_received_at is not None, 5, "the e-stop")
        received = agent.control.estop_received_at
        assert received is not None and received - pushed < 1.0
        wait_for(lambda: agent.heartbeat_state == "estopped", 5, "estopped state")
        steps_at_estop = agent.stats.steps
        time.sleep(20 * PERIOD)
        assert driver.is_estopped  # type: ignore[attr-defined]
        assert max(executed_at) <= received + PERIOD, "an action ran a period after the e-stop"
        assert agent.stats.steps == steps_at_estop
        assert agent.stats.episodes == 1  # the interrupted episode was closed
        # the spool drains while the robot stands still
        wait_for(lambda: spool.acked_seq == spool.next_seq - 1, 10, "spool drained in e-stop")
        assert spool.next_seq == steps_at_estop
        # the cloud sees it: heartbeat state -> robot status and event
        wait_for(lambda: _status(store, robot_id) == RobotStatus.ESTOPPED, 5, "robot estopped")
        # a resume does not release an e-stop
        push(cloud, robot_id, "resume")
        wait_for(lambda: agent.control.counts["resume"] == 1, 5, "the resume")
        time.sleep(10 * PERIOD)
        assert agent.stats.steps == steps_at_estop and driver.is_estopped  # type: ignore[attr-defined]

        # --- cleared at the robot: a new episode starts
        agent.clear_estop("test operator")
        wait_for(lambda: agent.stats.steps >= steps_at_estop + 15, 30, "steps after the clear")

        # --- pause mid-episode holds at a step boundary, resume continues the same episode
        push(cloud, robot_id, "pause")
        wait_for(lambda: agent.heartbeat_state == "paused", 5, "paused state")
        steps_at_pause = agent.stats.steps
        episodes_at_pause = agent.stats.episodes
        paused_episode = agent.next_episode_index - 1
        time.sleep(20 * PERIOD)
        assert agent.stats.steps == steps_at_pause
        # everything but the row held back to be closed properly reaches the cloud
        wait_for(lambda: spool.acked_seq == spool.next_seq - 1, 10, "spool drained in pause")
        # (unless the pause came exactly at an episode's first step)
        assert spool.next_seq in (steps_at_pause - 1, steps_at_pause)
        push(cloud, robot_id, "resume")
        wait_for(lambda: agent.stats.steps >= steps_at_pause + 10, 30, "steps after resume")
        assert agent.stats.episodes == episodes_at_pause  # no episode ended at the pause
        assert agent.next_episode_index - 1 == paused_episode

        agent.stop()
        runner.join(30)
        assert not runner.is_alive()
        total = agent.stats.steps
        assert agent.uplink.wait_acked(30)
        report = agent.report()
    finally:
        if built is not None:
            built.close()
        cloud.close()
    try:
        n = buf.visible - buf.index.base
        seqs = np.asarray(buf.index.cols["seq"][:n])
        rows = buf.read_transitions(np.arange(buf.index.base, buf.visible), count=False)
    finally:
        buf.close()
    assert sorted(seqs.tolist()) == list(range(total))  # nothing acknowledged lost, none twice
    episodes = rows["episode_index"]
    frames = rows["frame_index"]
    truncated = rows["truncated"]
    first = np.flatnonzero(episodes == 0)
    assert frames[first].tolist() == list(range(steps_at_estop))
    assert truncated[first].tolist() == [False] * (steps_at_estop - 1) + [True]
    paused = np.flatnonzero(episodes == paused_episode)  # stopped at the end of the test
    assert frames[paused].tolist() == list(range(len(paused)))
    assert not truncated[paused][:-1].any() and truncated[paused][-1]
    # its clock skipped the pause: no gap of a second between two stored steps
    assert np.diff(rows["timestamp"][paused]).max() < 5 * PERIOD
    assert report["control_estop"] == 1 and report["control_pause"] == 1
    assert report["control_resume"] == 2 and report["control_clear_estop"] == 1
    assert report["hold_s"] > 30 * PERIOD
    logged = [json.loads(x)["kind"] for x in (tmp_path / "spool" / "control.jsonl").open()]
    assert logged == ["estop", "resume", "clear_estop", "pause", "resume"]
    with store.session() as s:
        kinds = s.scalars(select(Event.kind).where(Event.robot_id == robot_id)).all()
    assert "robot.estopped" in kinds


def _status(store: Any, robot_id: int) -> RobotStatus | None:
    with store.session() as s:
        robot = s.get(Robot, robot_id)
        return None if robot is None else robot.status


# -- the same behaviour without the network (fast) --------------------------------------------


def test_estop_wakes_a_slow_loop_at_once_and_closes_the_episode(tmp_path: Path) -> None:
    """At 2 Hz the loop sleeps 0.5 s between steps; an e-stop must not wait for that."""
    driver = PointRobot(episode_steps=1000)
    agent = make_agent(tmp_path, driver, BiasPolicy(), settings=fast_edge(control_hz=2.0))
    runner = threading.Thread(target=agent.run)
    runner.start()
    wait_for(lambda: agent.stats.steps >= 2, 10, "two steps")
    t0 = time.monotonic()
    agent.control.handle("estop", "test")
    wait_for(lambda: agent.stats.episodes == 1, 5, "episode closed")
    assert time.monotonic() - t0 < 0.25 and driver.is_estopped
    sent = len(driver.sent)
    agent.stop()
    runner.join(10)
    assert not runner.is_alive() and len(driver.sent) == sent
    assert agent.uplink.flush()
    rows = spooled_rows(agent.uplink.spool)
    assert rows.column("truncated").to_pylist()[-1] is True
    assert rows.num_rows == sent and agent.heartbeat_state == "estopped"


def test_estop_before_an_episode_starts_leaves_no_empty_episode(tmp_path: Path) -> None:
    driver = PointRobot(episode_steps=3)
    agent = make_agent(tmp_path, driver, BiasPolicy())
    agent.control.handle("estop")
    runner = threading.Thread(target=agent.run, kwargs={"episodes": 2})
    runner.start()
    time.sleep(0.2)
    assert driver.sent == [] and agent.next_episode_index == 0
    agent.clear_estop()
    runner.join(10)
    assert not runner.is_alive()
    assert agent.stats.episodes == 2 and agent.next_episode_index == 2 and len(driver.sent) == 6


def test_unknown_or_noop_commands_change_nothing(tmp_path: Path) -> None:
    driver = PointRobot()
    control = CloudControl(driver, tmp_path / "control.jsonl")
    control.handle("self_destruct", seq=7)
    control.handle("lease_changed")
    assert not control.holding and not driver.is_estopped
    assert control.unknown == 1 and control.counts["lease_changed"] == 1
    assert [json.loads(x)["kind"] for x in (tmp_path / "control.jsonl").open()] == ["lease_changed"]
