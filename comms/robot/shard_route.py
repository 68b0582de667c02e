"""Where a robot's uploads of one run go: :class:`ShardRouter`.

A sharded run's robot uploads to its buffer shard's own ingest endpoint with a shard ticket
(``comms.wire.tickets``); the cloud tells it the address and ticket at assignment and again
on ``Ingest.Route``. The router keeps the current route and a channel to its address, and
asks the cloud again when the route is stale: after any upload stream to the shard ended
(the shard was away, restarted on another port, or refused the ticket) and when less than
a third of the ticket's lifetime is left. While the cloud cannot be asked, a route whose
ticket is still valid and was not refused is used as it is, so a cloud outage does not stop
uploads to a live shard. A route with an empty address sends the uploads to the cloud.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from comms.proto import robofleet_pb2 as pb
from comms.proto import robofleet_pb2_grpc as rpc
from comms.robot.client import EdgeClient, make_channel
from comms.wire import payload_messages
from comms.wire.tickets import ticket_metadata

log = logging.getLogger(__name__)
REFRESH_LEFT = 1 / 3  # ask for a fresh ticket when less than this share of its life is left

UploadStream = Callable[..., Any]
Metadata = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Route:
    """An ``IngestRoute``: ``address`` (empty: the cloud), ``ticket``, ``shard``, the ticket's
    ``expires_at`` and ``issued_at`` (the cloud's clock, unix seconds), ``tls``."""

    address: str
    ticket: str
    shard: int
    expires_at: float
    issued_at: float
    tls: bool

    @classmethod
    def from_proto(cls, m: pb.IngestRoute) -> Route:
        return cls(m.address, m.ticket, m.shard, m.expires_at, m.issued_at, m.tls)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Route:
        """From an assignment's ``ingest`` (``comms.cloud.shard_routes.ShardRoutes.route_dict``).

        Raises:
            KeyError / ValueError: a field is missing or not of its type.
        """
        return cls(
            str(d["address"]),
            str(d["ticket"]),
            int(d["shard"]),
            float(d["expires_at"]),
            float(d["issued_at"]),
            bool(d["tls"]),
        )

    def fresh(self, now: float) -> bool:
        """More than :data:`REFRESH_LEFT` of the ticket's lifetime is left at ``now`` (the
        robot's clock against the cloud's expiry: a skewed robot clock asks earlier or
        later; the shard's clock decides, and a ticket it refuses as expired makes the
        robot ask again)."""
        life = self.expires_at - self.issued_at
        return now < self.expires_at - life * REFRESH_LEFT


class ShardRouter:
    """The routes of robot ``robot_id``'s uploads of run ``run_id`` (module docstring).

    Args:
        client: the robot's connection to the cloud (``Ingest.Route``, its settings).
        run_id / robot_id: whose uploads.
        first: the route of the robot's assignment, if it came with one.
        clock: unix seconds (tests).

    Attributes:
        asked: how many times the cloud was asked for a route.
        shard_streams: upload streams opened to a shard.
    """

    def __init__(
        self,
        client: EdgeClient,
        run_id: str,
        robot_id: int,
        first: Route | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client, self.run_id, self.robot_id = client, run_id, robot_id
        self._stub = rpc.IngestStub(client.channel)
        self._clock = clock
        self._lock = threading.Lock()
        self._route = first
        self._stale = first is None
        self._refused = False
        self._channel: grpc.Channel | None = None
        self._channel_to: tuple[str, bool] | None = None
        self.asked = 0
        self.shard_streams = 0

    @property
    def route(self) -> Route | None:
        return self._route

    def target(self) -> tuple[UploadStream, Metadata, bool]:
        """(the upload call, its metadata, whether it goes to a shard) for the next stream.

        Raises:
            grpc.RpcError: the cloud could not be asked and no usable route is known.
        """
        route = self._current()
        if not route.address:
            return self.client.upload_stream, self.client.metadata, False
        with self._lock:
            channel = self._channel_for(route)
            self.shard_streams += 1
        upload = channel.stream_stream(
            "/robofleet.comms.v1.Experience/Upload",
            request_serializer=payload_messages.passthrough,
            response_deserializer=pb.UploadAck.FromString,
        )
        return upload, ticket_metadata(route.ticket, self.robot_id), True

    def stream_ended(self, code: grpc.StatusCode | None) -> None:
        """An upload stream to the shard ended with ``code``: ask the cloud before the next
        one (an UNAUTHENTICATED ticket is never used again)."""
        with self._lock:
            self._stale = True
            if code == grpc.StatusCode.UNAUTHENTICATED:
                self._refused = True

    def _current(self) -> Route:
        now = self._clock()
        with self._lock:
            route, stale, refused = self._route, self._stale, self._refused
        if route is not None and not stale and route.fresh(now):
            return route
        try:
            got = Route.from_proto(
                self._stub.Route(
                    pb.RouteRequest(run_id=self.run_id),
                    metadata=self.client.metadata,
                    timeout=self.client.settings.call_timeout_s,
                )
            )
        except grpc.RpcError as exc:
            usable = route is not None and not refused and now < route.expires_at
            if not usable:
                raise
            log.info("asking the cloud for an ingest route failed (%s); using the last", exc)
            assert route is not None
            return route
        finally:
            self.asked += 1
        with self._lock:
            self._route, self._stale, self._refused = got, False, False
        return got

    def _channel_for(self, route: Route) -> grpc.Channel:
        """The channel to ``route``'s address (one at a time; another address closes it)."""
        want = (route.address, route.tls)
        if self._channel is None or self._channel_to != want:
            if self._channel is not None:
                self._channel.close()
            self._channel = make_channel(route.address, self.client.settings, tls_on=route.tls)
            self._channel_to = want
        return self._channel

    def close(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close()
                self._channel = None
