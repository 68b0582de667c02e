"""Remote inference over a real gRPC Act service: chunks on time, a safe hold when late."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from comms.cloud.step_sink import MemorySink
from edge_agent.grpc_client import EdgeActClient
from edge_agent.inference import NO_POLICY, RemotePolicyRunner
from tests.edge_agent.helpers import make_agent, spooled_rows
from tests.fakes.cloud import RUN, Cloud
from tests.fakes.robot import PointRobot
from tests.fakes.settings import fast_edge

CHUNK = (
    np.array([[0.1, 0.2, 0.3, 0.4]] * 3, np.float32) + np.arange(3, dtype=np.float32)[:, None] / 10
)


class SlowPolicy:
    """The cloud's policy: a fixed 3-step chunk, version 7, after ``delay`` seconds."""

    def __init__(self) -> None:
        self.delay = 0.0
        self.first_delays: list[float] = []  # delays of the next calls, then ``delay``
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self, run_id, observation, task):
        with self.lock:
            self.calls += 1
            delay = self.first_delays.pop(0) if self.first_delays else self.delay
        assert observation["observation.state"].dtype == np.float32
        time.sleep(delay)
        return CHUNK, 7


@pytest.fixture
def act_client(db):
    _url, store = db
    policy = SlowPolicy()
    cloud = Cloud(store, MemorySink(), act_handler=policy)
    client = cloud.client(cloud.robot("remote-robot", lease=RUN))
    act = EdgeActClient(client, RUN, timeout_s=2.0)
    yield act, policy
    act.close()
    client.close()
    cloud.close()


OBS = {"observation.state": np.zeros(3, np.float32)}


def test_chunks_in_time_are_executed_step_by_step(act_client):
    act, policy = act_client
    runner = RemotePolicyRunner(act, 4, ["reach-v3"], deadline_s=1.0)
    got = [runner.act(OBS, 0) for _ in range(6)]
    assert np.allclose(np.stack([a for a, _ in got]), np.concatenate([CHUNK, CHUNK]))
    assert {v for _, v in got} == {7}
    assert policy.calls == 2  # one call per chunk
    assert runner.holds == 0


def test_a_missed_deadline_holds_safely_then_recovers(act_client):
    act, policy = act_client
    runner = RemotePolicyRunner(act, 4, ["reach-v3"], deadline_s=0.05, hold_keep_dims=[3])
    runner.last_executed = np.array([0.9, 0.9, 0.9, -1.0], np.float32)
    policy.delay = 0.4
    t0 = time.monotonic()
    action, version = runner.act(OBS, 0)
    assert time.monotonic() - t0 < 0.35  # the step did not wait for the 0.4 s call
    assert version == NO_POLICY
    assert np.array_equal(action, [0.0, 0.0, 0.0, -1.0])  # zeros, gripper kept
    # While that call is still out, later steps hold without piling up more calls.
    for _ in range(3):
        assert runner.act(OBS, 0)[1] == NO_POLICY
    assert policy.calls == 1
    # Wait for the late call to end (on a loaded machine 0.4 s can take longer), then give the
    # fresh call a deadline a loaded gRPC round trip meets: what is tested is that the late
    # reply is dropped and a new call answers, not how fast loopback is.
    late = runner._inflight
    assert late is not None
    late.result(timeout=10)
    policy.delay = 0.0
    runner.deadline_s = 5.0
    action, version = runner.act(OBS, 0)  # the late reply is dropped, a fresh call answers
    assert version == 7 and np.allclose(action, CHUNK[0])
    assert runner.late_replies == 1 and runner.holds == 4 and policy.calls == 2


def test_hold_steps_are_recorded_as_produced_by_no_policy(tmp_path, act_client):
    act, policy = act_client
    policy.first_delays = [0.3]  # the first call is late; later ones come well in time
    runner = RemotePolicyRunner(act, 4, ["reach-v3"], deadline_s=0.2)
    # 50 Hz: the 30 steps last 0.6 s, so the late call (0.3 s) ends mid-episode and later
    # steps ask again (at 200 Hz a fast machine ran every step before it ended).
    settings = fast_edge(control_hz=50.0)
    agent = make_agent(
        tmp_path, PointRobot(episode_steps=30), None, runner=runner, settings=settings
    )
    agent.run(episodes=1)
    agent.uplink.flush()
    rows = spooled_rows(agent.uplink.spool)
    versions = np.asarray(rows.column("policy_version").to_pylist())
    executed = np.stack(rows.column("action").to_numpy(zero_copy_only=False))
    assert versions[0] == NO_POLICY and (versions == 7).any()
    assert np.allclose(executed[versions == NO_POLICY], 0.0)
    assert agent.report()["holds"] == float((versions == NO_POLICY).sum())


def test_remote_runner_refuses_bad_settings(act_client):
    act, _ = act_client
    with pytest.raises(ValueError, match="hold_keep_dims"):
        RemotePolicyRunner(act, 4, ["t"], deadline_s=0.1, hold_keep_dims=[4])
    with pytest.raises(ValueError, match="deadline_s"):
        RemotePolicyRunner(act, 4, ["t"], deadline_s=0.0)
