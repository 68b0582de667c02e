"""The Ingest service: where a robot uploads its steps of a run (``comms.cloud.shard_routes``)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc.aio

from comms.cloud.services.common import ServerState, guarded, identify
from comms.proto import robofleet_pb2 as pb
from comms.proto import robofleet_pb2_grpc as rpc


class IngestServicer(rpc.IngestServicer):
    def __init__(self, state: ServerState) -> None:
        self.s = state

    @guarded
    async def Route(self, request: Any, context: grpc.aio.ServicerContext) -> pb.IngestRoute:
        """The caller's route for ``run_id`` (it must hold a lease on the run): its shard's
        endpoint and a fresh ticket for a sharded run, empty (the cloud's own Experience
        service) for any other run."""
        ident = await identify(self.s, context)
        await asyncio.to_thread(self.s.auth.require_lease, ident, request.run_id)
        routes = self.s.routes(request.run_id)
        if routes is None:
            return pb.IngestRoute()
        return routes.route(ident.robot_id, ident.name)
