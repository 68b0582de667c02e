"""The Act service (remote inference): an observation in, an action chunk and the policy
version that chose it out; and the tensor messages it uses (also the client's)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import grpc.aio
import numpy as np

from comms import tensors as T
from comms.proto import robofleet_pb2 as pb
from comms.proto import robofleet_pb2_grpc as rpc
from comms.services.common import ServerState, guarded, identify


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


def tensor_to_proto(value: Any) -> pb.Tensor:
    arr, dtype = T.as_array(value)
    return pb.Tensor(dtype=dtype, shape=list(arr.shape), data=arr.tobytes())


def tensor_from_proto(t: pb.Tensor) -> np.ndarray:
    """Raises TensorFormatError when dtype, shape and byte count disagree."""
    if t.dtype not in T.DTYPES:
        raise T.TensorFormatError(f"unknown dtype {t.dtype!r}")
    dt = T.DTYPES[t.dtype]
    n = int(np.prod(list(t.shape), dtype=np.int64)) if t.shape else 1
    if any(s < 0 for s in t.shape) or n * dt.itemsize != len(t.data):
        raise T.TensorFormatError(f"{len(t.data)} bytes do not hold {t.dtype}{list(t.shape)}")
    return np.frombuffer(t.data, dtype=dt).reshape(tuple(t.shape))
