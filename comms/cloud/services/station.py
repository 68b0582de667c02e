"""The Station service: what a robot shows the dashboard's operator station, kept in memory.

Each robot's latest :class:`StationView` replaces its previous one; nothing is stored on disk
(a frame is a live picture, not a record: the steps are the record). The dashboard reads the
views through ``CloudServer.station_view`` and times its takeover round trip by ``echo_id``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import grpc
import grpc.aio

from comms.cloud.services.common import ServerState, guarded, identify
from comms.proto import robofleet_pb2 as pb
from comms.proto import robofleet_pb2_grpc as rpc

MAX_FRAME_BYTES = 512 * 1024  # a station thumbnail; a larger one is a mistake, refused
FRAME_FORMATS = ("jpeg", "png")


@dataclass(frozen=True)
class StationView:
    """One robot's latest report (``received``: ``time.monotonic()`` on the cloud)."""

    run_id: str
    frame: bytes
    frame_format: str
    camera: str
    taken_over: bool
    echo_id: int
    note: str
    received: float


class StationServicer(rpc.StationServicer):
    def __init__(self, state: ServerState) -> None:
        self.s = state

    @guarded
    async def Report(
        self, request: pb.StationReport, context: grpc.aio.ServicerContext
    ) -> pb.StationReply:
        ident = await identify(self.s, context)
        if len(request.frame) > MAX_FRAME_BYTES:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"StationReport.frame: {len(request.frame)} bytes, at most {MAX_FRAME_BYTES}",
            )
        if request.frame and request.frame_format not in FRAME_FORMATS:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"StationReport.frame_format {request.frame_format!r}: one of {FRAME_FORMATS}",
            )
        old = self.s.station.get(ident.robot_id)
        keep = not request.frame and old is not None  # an echo alone keeps the last frame
        self.s.station[ident.robot_id] = StationView(
            run_id=request.run_id,
            frame=old.frame if keep and old else bytes(request.frame),
            frame_format=old.frame_format if keep and old else request.frame_format,
            camera=old.camera if keep and old else request.camera,
            taken_over=request.taken_over,
            echo_id=int(request.echo_id),
            note=request.note,
            received=time.monotonic(),
        )
        return pb.StationReply()
