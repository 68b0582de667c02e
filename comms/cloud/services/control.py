"""The Control service: commands (e-stop, pause, resume, lease changed) pushed to a robot."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc.aio

from comms.cloud.services.common import OpenStream, ServerState, guarded, identify, write
from comms.proto import robofleet_pb2 as pb
from comms.proto import robofleet_pb2_grpc as rpc


class ControlServicer(rpc.ControlServicer):
    def __init__(self, state: ServerState) -> None:
        self.s = state

    @guarded
    async def Commands(self, request: pb.ControlRequest, context: grpc.aio.ServicerContext) -> None:
        ident = await identify(self.s, context)
        q: asyncio.Queue[pb.ControlCommand] = asyncio.Queue(maxsize=64)
        self.s.control[ident.robot_id] = q  # a reconnecting robot replaces its old stream
        try:
            with OpenStream(self.s):
                while True:
                    cmd = await q.get()
                    await write(self.s, context, cmd)
        finally:
            if self.s.control.get(ident.robot_id) is q:
                del self.s.control[ident.robot_id]


def control_command(
    state: ServerState,
    kind: Any,
    run_id: str = "",
    reason: str = "",
    assignment: str = "",
    teleop: str = "",
) -> pb.ControlCommand:
    state.control_seq += 1
    return pb.ControlCommand(
        kind=kind,
        run_id=run_id,
        reason=reason,
        seq=state.control_seq,
        assignment=assignment,
        teleop=teleop,
    )
