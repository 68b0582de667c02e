"""Help requests over the real wire: a robot's request rides its heartbeat into the store, a
person's answer reaches the robot's help desk on the Control stream, a malformed report is
refused by name."""

from __future__ import annotations

import json
import time

import grpc
import pytest

from edge_agent.control import CloudControl, listen
from edge_agent.help import HelpDesk, HelpSettings
from foundation.store.help_requests import answer, open_requests
from tests.comms.helpers import rpc_code
from tests.fakes.cloud import RUN, Cloud


class _Driver:
    def estop(self) -> None:
        pass


def test_request_up_in_a_heartbeat_answer_down_on_control(cloud: Cloud) -> None:
    robot = cloud.robot("arm-1")
    client = cloud.client(robot)
    desk = HelpDesk(HelpSettings(risk="probe", timeout_s=30.0), "arm-1")
    control = CloudControl(_Driver())
    control.on_help = desk.answered
    listener = listen(client, control)
    try:
        assert desk.observe(0.9, episode=4, step=11, eligible=True)
        reports, token = desk.outbox()
        client.heartbeat("running", 1, {}, run_id=RUN, info={"help": reports})
        desk.delivered(token)
        [row] = open_requests(cloud.store, RUN)
        assert (row["key"], row["episode_index"], row["step"], row["risk"]) == (
            "arm-1:4:11",
            4,
            11,
            0.9,
        )
        answer(cloud.store, RUN, row["id"], "dismissed", "user:alice")
        reason = json.dumps({"key": row["key"], "outcome": "dismissed", "by": "user:alice"})
        deadline = time.monotonic() + 10
        while not cloud.server.push_control(robot.robot_id, "help_answered", RUN, reason):
            assert time.monotonic() < deadline, "control stream never registered"
            time.sleep(0.05)
        while desk.waiting:
            assert time.monotonic() < deadline, "the answer never reached the help desk"
            time.sleep(0.02)
        assert (desk.requests[0].outcome, desk.requests[0].by) == ("dismissed", "user:alice")
        with pytest.raises(grpc.RpcError) as err:
            client.heartbeat("running", 1, {}, run_id=RUN, info={"help": [{"key": "x"}]})
        assert rpc_code(err.value) == grpc.StatusCode.INVALID_ARGUMENT
        assert "help report" in (err.value.details() or "")
    finally:
        listener.close()
        client.close()
