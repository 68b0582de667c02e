"""Where a sharded run's robots upload: their shard's ingest endpoint, with a shard ticket.

:class:`ShardRoutes` is the cloud's side of one sharded run: it knows the run's ticket key
(given to the run's shards when they start), how many shards there are, and the shards'
ingest addresses as last reported (a shard Ray restarted may listen on another port). For a
robot it gives an ``IngestRoute`` message: the address of shard ``shard_of(robot_id, n)``
and a ticket for that robot, run and shard, valid ``ttl_s`` seconds
(``comms.wire.tickets``). The cloud's ``Ingest.Route`` call and the robots' assignments
both take their routes here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from buffer.service.shards import shard_of
from comms.proto import robofleet_pb2 as pb
from comms.wire import tickets


class ShardRoutes:
    """The routes of run ``run_id``'s robots to its ``shards`` shards (module docstring).

    Args:
        run_id: the run.
        key: the run's ticket key (its shards verify with the same).
        shards: the run's shard count.
        addresses: the shards' ingest ``host:port`` as last reported, shard ``k`` at ``k``
            (empty: not known yet).
        tls: the shards' endpoints serve TLS.
        ttl_s: a ticket's lifetime in seconds.
    """

    def __init__(
        self,
        run_id: str,
        key: bytes,
        shards: int,
        addresses: Callable[[], Sequence[str]],
        *,
        tls: bool = False,
        ttl_s: float = 600.0,
    ) -> None:
        self.run_id, self.key, self.shards = run_id, key, shards
        self.addresses, self.tls, self.ttl_s = addresses, tls, ttl_s

    def route(self, robot_id: int, name: str, now: float | None = None) -> pb.IngestRoute:
        """Robot ``robot_id``'s (named ``name``) route: its shard's address and a fresh
        ticket. The address is empty while the shard's is not known yet (the robot asks
        again)."""
        k = shard_of(robot_id, self.shards)
        t = time.time() if now is None else now
        known = list(self.addresses())
        ticket = tickets.Ticket(self.run_id, robot_id, name, k, t + self.ttl_s)
        return pb.IngestRoute(
            address=known[k] if k < len(known) else "",
            ticket=tickets.issue(self.key, ticket),
            shard=k,
            expires_at=ticket.expires_at,
            issued_at=t,
            tls=self.tls,
        )

    def route_dict(self, robot_id: int, name: str) -> dict[str, Any]:
        """:meth:`route` as plain values (``IngestRoute``'s fields), for an assignment."""
        r = self.route(robot_id, name)
        return {
            "address": r.address,
            "ticket": r.ticket,
            "shard": r.shard,
            "expires_at": r.expires_at,
            "issued_at": r.issued_at,
            "tls": r.tls,
        }


# run_id -> the routes of its robots to its shards, or None (its robots upload to the cloud).
RouteResolver = Callable[[str], ShardRoutes | None]
