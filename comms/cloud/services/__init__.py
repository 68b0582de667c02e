"""The cloud's gRPC servicers (grpc.aio), one module per service:

=====================  ===============================================================
module                 service
=====================  ===============================================================
``enrollment``         Enrollment: a one-time token for a robot id and credential
``experience``         Experience: step batches in (gRPC or the data plane), acks out
``ingest``             Ingest: where a robot uploads (a sharded run's shard, with a ticket)
``episodes``           Episodes: a robot's marks on its episodes (discard, rerecord)
``weights``            Weights: policy versions streamed latest-only; Fetch repairs
``heartbeat``          Heartbeat: state, applied policy version, loop stats
``control``            Control: commands pushed to a robot (e-stop, pause, ...)
``act``                Act: remote inference
``station``            Station: a robot's latest frame and takeover echo, for the dashboard
``common``             what they share: ``ServerState``, ``guarded`` (refusals to status
                       codes), ``identify``, ``write``, server options
``requests``           requests decoded without raising, required fields, registration
=====================  ===============================================================

Blocking work (database, sink appends with fsync, Arrow parsing, policy inference) runs in
worker threads so one slow robot never stalls the event loop. Streams have a per-message idle
timeout: a peer that neither sends nor reads for ``stream_idle_timeout_s`` is dropped and its
slot freed (HTTP/2 keepalive catches a peer that vanished outright).
"""

from __future__ import annotations

from typing import Any

import grpc.aio

from comms.cloud.services.act import ActServicer
from comms.cloud.services.common import ServerState
from comms.cloud.services.control import ControlServicer
from comms.cloud.services.enrollment import EnrollmentServicer
from comms.cloud.services.episodes import EpisodesServicer
from comms.cloud.services.experience import ExperienceServicer
from comms.cloud.services.heartbeat import HeartbeatServicer
from comms.cloud.services.ingest import IngestServicer
from comms.cloud.services.requests import add_service
from comms.cloud.services.station import StationServicer
from comms.cloud.services.weights import WeightsServicer
from comms.proto import robofleet_pb2 as pb


def add_servicers(server: grpc.aio.Server, state: ServerState) -> None:
    """Register every service of robofleet.proto on ``server``.

    Raises:
        RuntimeError: the proto has a service no servicer here implements.
    """
    servicers: dict[str, Any] = {
        "Enrollment": EnrollmentServicer(state),
        "Experience": ExperienceServicer(state),
        "Ingest": IngestServicer(state),
        "Episodes": EpisodesServicer(state),
        "Weights": WeightsServicer(state),
        "Heartbeat": HeartbeatServicer(state),
        "Control": ControlServicer(state),
        "Act": ActServicer(state),
        "Station": StationServicer(state),
    }
    missing = sorted(set(pb.DESCRIPTOR.services_by_name) - set(servicers))
    if missing:
        raise RuntimeError(f"no servicer for service(s) {', '.join(missing)}")
    for name, servicer in servicers.items():
        add_service(server, servicer, name)
