"""End to end: real Meta-World robot and expert, real comms gRPC cloud, real replay buffer.

The cloud process is SIGKILLed in the middle of an episode and started again; every step the
agent took must be in the buffer exactly once (seq 0..N-1, no gap, no duplicate).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from edge_agent.build import AgentOptions, build_agent
from edge_agent.config import EdgeSettings
from tests.comms.helpers import fast_settings
from tests.edge_agent.conftest import RUN, free_port

REPO = Path(__file__).resolve().parents[2]


def start_cloud(db_url: str, buffer_dir: Path, port: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.edge_agent.cloud_proc", db_url, str(buffer_dir), str(port)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "ready", f"cloud process did not start (got {line!r})"
    return proc


def kill(proc: subprocess.Popen[str]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)


def wait_for(cond, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_spool_drains_after_the_cloud_is_killed_and_restarted_mid_episode(tmp_path, db):
    from buffer.replay_buffer import ReplayBuffer

    url, store = db
    port = free_port()
    buffer_dir = tmp_path / "buffer"
    cloud = start_cloud(url, buffer_dir, port)
    try:
        token = store.create_enrollment_token(timedelta(minutes=5))
        edge = EdgeSettings(
            control_hz=20.0,
            batch_max_steps=8,
            batch_max_delay_s=0.2,
            wait_for_first_weights=False,  # this cloud publishes no policy
        )
        opts = AgentOptions(
            robot_name="sawyer-e2e",
            tasks=["reach-v3"],
            run_id=RUN,
            server=f"127.0.0.1:{port}",
            token=token,
            operator="scripted",
            max_episode_steps=50,
            spool_dir=tmp_path / "spool",
        )
        built = build_agent(edge, fast_settings(), opts)
        robot_id = json.loads((tmp_path / "spool" / "credential.json").read_text())["robot_id"]
        store.lease_robots(RUN, [robot_id])
        agent, spool = built.agent, built.agent.uplink.spool
        runner = threading.Thread(target=agent.run, kwargs={"episodes": 3})
        runner.start()
        wait_for(lambda: spool.acked_seq >= 15, 30, "the first acknowledged steps")
        # Kill the cloud in the middle of the second episode.
        wait_for(lambda: agent.stats.steps >= 62, 30, "the second episode")
        kill(cloud)
        killed_at = agent.stats.steps
        acked_at_kill = spool.acked_seq
        time.sleep(1.5)  # the robot keeps working; its steps pile up on disk
        assert agent.stats.steps > killed_at + 10
        assert spool.acked_seq == acked_at_kill and len(spool) > 0
        cloud = start_cloud(url, buffer_dir, port)
        runner.join(60)
        assert not runner.is_alive()
        total = agent.stats.steps
        assert total == 150
        assert agent.uplink.wait_acked(30), "the spool did not drain after the restart"
        assert len(spool) == 0 and spool.acked_seq == total - 1
        built.close()
    finally:
        kill(cloud)

    buf = ReplayBuffer.open(buffer_dir, read_only=True)
    try:
        n = buf.visible - buf.index.base
        seqs = np.asarray(buf.index.cols["seq"][:n])
        rows = buf.read_transitions(np.arange(buf.index.base, buf.visible), count=False)
    finally:
        buf.close()
    assert sorted(seqs.tolist()) == list(range(total))  # none lost, none twice
    pairs = sorted(zip(rows["episode_index"].tolist(), rows["frame_index"].tolist(), strict=True))
    assert pairs == [(e, f) for e in range(3) for f in range(50)]
    # the scripted expert really intervened and its flag reached the buffer
    assert 0 < int(np.sum(rows["is_intervention"])) <= total
