"""The Heartbeat service: a robot's state, applied policy version and loop stats, recorded."""

from __future__ import annotations

import asyncio
import json
import time

import grpc
import grpc.aio

from comms.cloud.liveness import record_heartbeat
from comms.cloud.services.common import ServerState, guarded, identify
from comms.proto import robofleet_pb2 as pb
from comms.proto import robofleet_pb2_grpc as rpc
from foundation.store.help_requests import HelpRequestError


class HeartbeatServicer(rpc.HeartbeatServicer):
    def __init__(self, state: ServerState) -> None:
        self.s = state

    @guarded
    async def Beat(
        self, request: pb.HeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> pb.HeartbeatReply:
        ident = await identify(self.s, context)
        try:
            info = json.loads(request.info_json) if request.info_json else {}
            if not isinstance(info, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"info_json: {exc}")
        applied = (
            None if request.applied_policy_version < 0 else int(request.applied_policy_version)
        )
        try:
            await asyncio.to_thread(
                record_heartbeat,
                self.s.metadata_store(),
                ident.robot_id,
                request.state,
                applied,
                dict(request.stats),
                request.run_id,
                info,
            )
        except HelpRequestError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"info_json: {exc}")
        return pb.HeartbeatReply(server_time=time.time())
