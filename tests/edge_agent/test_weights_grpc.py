"""New weights published in the cloud reach a running agent through comms and apply at an
episode boundary; the applied version and loop statistics come back in heartbeats."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import numpy as np
import pytest
import torch

from comms.cloud.step_sink import MemorySink
from edge_agent.build import AgentOptions, build_agent
from foundation.store.models import Robot
from tests.fakes.cloud import RUN, Cloud
from tests.fakes.settings import fast_comms, fast_edge


@pytest.mark.slow
def test_published_version_applies_at_episode_end_and_is_reported(tmp_path, db):
    from cloud_learner.policies import MLPPolicy, PolicySpec

    _url, store = db
    sink = MemorySink()
    cloud = Cloud(store, sink)
    built = None
    try:
        edge = fast_edge(
            control_hz=50.0,
            weight_apply_at="episode_end",
            wait_for_first_weights=False,  # act before the first version, to see it arrive
        )
        opts = AgentOptions(
            robot_name="weights-robot",
            tasks=["reach-v3"],
            driver="metaworld",
            run_id=RUN,
            server=cloud.address,
            token=store.create_enrollment_token(timedelta(minutes=5)),
            operator="none",
            max_episode_steps=25,
            spool_dir=tmp_path / "spool",
        )
        built = build_agent(edge, fast_comms(), opts)
        robot_id = json.loads((tmp_path / "spool" / "credential.json").read_text())["robot_id"]
        store.lease_robots(RUN, [robot_id])
        agent = built.agent
        thread = threading.Thread(target=agent.run, kwargs={"episodes": 4})
        thread.start()
        while agent.stats.steps < 5:
            time.sleep(0.01)
        torch.manual_seed(1)
        trained = MLPPolicy(PolicySpec(39, 4, num_tasks=1, hidden=64))
        cloud.server.distributor(RUN).publish(trained.get_weights(), version=5)
        thread.join(60)
        assert not thread.is_alive()
        assert agent.uplink.wait_acked(20)
        time.sleep(0.5)  # one more heartbeat after the last episode
    finally:
        if built is not None:
            built.close()
        cloud.close()
    assert agent.applied_version == 5
    rows = [b for _rid, b in sink.batches]
    versions = np.concatenate([b.column("policy_version").to_numpy() for b in rows])
    episodes = np.concatenate([b.column("episode_index").to_numpy() for b in rows])
    for e in np.unique(episodes):  # a version never changes inside an episode
        assert len(set(versions[episodes == e].tolist())) == 1
    assert versions[episodes == 0][0] == -1 and versions[-1] == 5
    # the policy on the robot now acts exactly as the published one
    obs = {"observation.state": np.linspace(-1, 1, 39).astype(np.float32)}
    assert np.allclose(agent.runner.policy.act(obs, 0), trained.act(obs, 0), atol=1e-6)
    with store.session() as s:
        robot = s.get(Robot, robot_id)
        assert robot is not None and robot.applied_policy_version == 5
        assert robot.stats["steps"] == 100.0
        assert {"latency_p99_ms", "overruns", "spool_bytes", "dropped_steps"} <= set(robot.stats)
