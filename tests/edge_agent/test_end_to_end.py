"""End to end: real Meta-World robot and expert, real comms gRPC cloud, real replay buffer.

The cloud process is SIGKILLed in the middle of an episode and started again; every step the
agent took must be in the buffer exactly once (seq 0..N-1, no gap, no duplicate).
"""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import numpy as np
import pytest

from edge_agent.build import AgentOptions, build_agent
from tests.fakes.cloud import RUN, CloudProcess, free_port
from tests.fakes.procs import wait_until
from tests.fakes.settings import fast_comms, fast_edge


@pytest.mark.slow
def test_spool_drains_after_the_cloud_is_killed_and_restarted_mid_episode(tmp_path, db):
    from buffer.table.replay_buffer import ReplayBuffer

    url, store = db
    port = free_port()
    buffer_dir = tmp_path / "buffer"
    cloud = CloudProcess(url, buffer_dir, port)
    try:
        token = store.create_enrollment_token(timedelta(minutes=5))
        edge = fast_edge(
            control_hz=20.0,
            batch_max_steps=8,
            wait_for_first_weights=False,  # this cloud publishes no policy
        )
        opts = AgentOptions(
            robot_name="sawyer-e2e",
            tasks=["reach-v3"],
            driver="metaworld",
            run_id=RUN,
            server=f"127.0.0.1:{port}",
            token=token,
            operator="scripted",
            max_episode_steps=50,
            spool_dir=tmp_path / "spool",
        )
        built = build_agent(edge, fast_comms(), opts)
        robot_id = json.loads((tmp_path / "spool" / "credential.json").read_text())["robot_id"]
        store.lease_robots(RUN, [robot_id])
        agent, spool = built.agent, built.agent.uplink.spool
        runner = threading.Thread(target=agent.run, kwargs={"episodes": 3})
        runner.start()
        wait_until(lambda: spool.acked_seq >= 15, 30, "the first acknowledged steps", poll_s=0.02)
        # Kill the cloud in the middle of the second episode.
        wait_until(lambda: agent.stats.steps >= 62, 30, "the second episode", poll_s=0.02)
        cloud.kill()
        killed_at = agent.stats.steps
        acked_at_kill = spool.acked_seq
        time.sleep(1.5)  # the robot keeps working; its steps pile up on disk
        assert agent.stats.steps > killed_at + 10
        assert spool.acked_seq == acked_at_kill and len(spool) > 0
        cloud = CloudProcess(url, buffer_dir, port)
        runner.join(60)
        assert not runner.is_alive()
        total = agent.stats.steps
        assert total == 150
        assert agent.uplink.wait_acked(30), "the spool did not drain after the restart"
        assert len(spool) == 0 and spool.acked_seq == total - 1
        built.close()
    finally:
        cloud.kill()

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
