"""The cloud's gRPC servicers (grpc.aio), one module per service:

=====================  ===============================================================
module                 service
=====================  ===============================================================
``enrollment``         Enrollment: a one-time token for a robot id and credential
``experience``         Experience: step batches in (gRPC or the data plane), acks out
``episodes``           Episodes: a robot's marks on its episodes (discard, rerecord)
``weights``            Weights: policy versions streamed latest-only; Fetch repairs
``heartbeat``          Heartbeat: state, applied policy version, loop stats
``control``            Control: commands pushed to a robot (e-stop, pause, ...)
``act``                Act: remote inference
``common``             what they share: ``ServerState``, ``guarded`` (refusals to status
                       codes), ``identify``, ``write``, server options
=====================  ===============================================================

Blocking work (database, sink appends with fsync, Arrow parsing, policy inference) runs in
worker threads so one slow robot never stalls the event loop. Streams have a per-message idle
timeout: a peer that neither sends nor reads for ``stream_idle_timeout_s`` is dropped and its
slot freed (HTTP/2 keepalive catches a peer that vanished outright).
"""

from __future__ import annotations

import grpc.aio

from comms.proto import robofleet_pb2_grpc as rpc
from comms.services.act import ActServicer
from comms.services.common import ServerState
from comms.services.control import ControlServicer
from comms.services.enrollment import EnrollmentServicer
from comms.services.episodes import EpisodesServicer
from comms.services.experience import ExperienceServicer
from comms.services.heartbeat import HeartbeatServicer
from comms.services.weights import WeightsServicer, add_weights_servicer


def add_servicers(server: grpc.aio.Server, state: ServerState) -> None:
    """Register every service of the cloud server on ``server``."""
    rpc.add_EnrollmentServicer_to_server(EnrollmentServicer(state), server)
    rpc.add_ExperienceServicer_to_server(ExperienceServicer(state), server)
    rpc.add_EpisodesServicer_to_server(EpisodesServicer(state), server)
    add_weights_servicer(server, WeightsServicer(state))
    rpc.add_HeartbeatServicer_to_server(HeartbeatServicer(state), server)
    rpc.add_ControlServicer_to_server(ControlServicer(state), server)
    rpc.add_ActServicer_to_server(ActServicer(state), server)
