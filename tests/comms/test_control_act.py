"""Control commands pushed to a robot, and remote inference with a deadline."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from comms.cloud.server import CloudServer
from comms.cloud.step_sink import MemorySink
from comms.proto import robofleet_pb2 as pb
from comms.robot.client import ControlListener, EdgeClient
from foundation.store.metadata_store import MetadataStore
from tests.comms.helpers import rpc_code
from tests.fakes.cloud import RUN, Cloud


def test_estop_pause_resume_reach_the_robot(cloud: Cloud) -> None:
    robot = cloud.robot("arm-1")
    client = cloud.client(robot)
    got: queue.Queue[pb.ControlCommand] = queue.Queue()
    listener = ControlListener(client, got.put)
    try:
        deadline = time.monotonic() + 10
        while not cloud.server.push_control(robot.robot_id, "estop", RUN, "operator"):
            assert time.monotonic() < deadline, "control stream never registered"
            time.sleep(0.05)
        assert cloud.server.push_control(robot.robot_id, "pause", RUN)
        assert cloud.server.push_control(robot.robot_id, "lease_changed", RUN)
        kinds = [got.get(timeout=5).kind for _ in range(3)]
        assert kinds == [
            pb.ControlCommand.ESTOP,
            pb.ControlCommand.PAUSE,
            pb.ControlCommand.LEASE_CHANGED,
        ]
        with pytest.raises(ValueError, match="unknown control kind"):
            cloud.server.push_control(robot.robot_id, "explode")
    finally:
        listener.close()
        client.close()


@pytest.fixture
def act_cloud(store: MetadataStore) -> Iterator[tuple[CloudServer, EdgeClient]]:
    def policy(run_id: str, obs: dict[str, np.ndarray], task: str) -> tuple[np.ndarray, int]:
        if task == "slow":
            time.sleep(1.0)
        state = obs["observation.state"].astype(np.float32)
        return np.stack([state * (i + 1) for i in range(4)]), 12  # chunk of 4 actions

    cloud = Cloud(store, MemorySink(), act_handler=policy)
    client = cloud.client(cloud.robot("arm-1"))
    yield cloud.server, client
    client.close()
    cloud.close()


def test_act_returns_an_action_chunk(act_cloud: tuple[CloudServer, EdgeClient]) -> None:
    _, client = act_cloud
    state = np.arange(6, dtype=np.float32)
    action, version = client.act(RUN, {"observation.state": state}, task="reach")
    assert version == 12 and action.shape == (4, 6)
    np.testing.assert_array_equal(action[2], state * 3)


def test_act_past_its_deadline_fails_cleanly(act_cloud: tuple[CloudServer, EdgeClient]) -> None:
    _, client = act_cloud
    with pytest.raises(grpc.RpcError) as err:
        client.act(RUN, {"observation.state": np.zeros(6, np.float32)}, task="slow", timeout_s=0.2)
    assert rpc_code(err.value) == grpc.StatusCode.DEADLINE_EXCEEDED
    with pytest.raises(grpc.RpcError) as err:
        client.act("run-other", {"observation.state": np.zeros(6, np.float32)})
    assert rpc_code(err.value) == grpc.StatusCode.PERMISSION_DENIED
