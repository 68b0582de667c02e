"""The Act service (remote inference): an observation in, an action chunk and the policy
version that chose it out."""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio

from comms.cloud.services.common import ServerState, guarded, identify
from comms.proto import robofleet_pb2 as pb
from comms.proto import robofleet_pb2_grpc as rpc
from comms.wire import tensors as T
from comms.wire.tensor_messages import tensor_from_proto, tensor_to_proto


class ActServicer(rpc.ActServicer):
    def __init__(self, state: ServerState) -> None:
        self.s = state

    @guarded
    async def Act(self, request: pb.ActRequest, context: grpc.aio.ServicerContext) -> pb.ActReply:
        ident = await identify(self.s, context)
        await asyncio.to_thread(self.s.auth.require_lease, ident, request.run_id)
        handler = self.s.act_handler
        if handler is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this server runs no remote policy")
        assert handler is not None
        try:
            obs = {k: tensor_from_proto(v) for k, v in request.observation.items()}
        except (T.TensorFormatError, KeyError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"observation: {exc}")
        remaining = context.time_remaining()
        try:
            action, version = await asyncio.wait_for(
                asyncio.to_thread(handler, request.run_id, obs, request.task), remaining
            )
        except TimeoutError:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "policy did not answer in time")
        return pb.ActReply(action=tensor_to_proto(action), policy_version=version)
