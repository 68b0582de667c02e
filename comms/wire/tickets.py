"""Shard tickets: what lets a robot upload to its buffer shard's ingest endpoint.

A sharded run's shards never see the robots' credentials. The cloud, which does, gives each
leased robot a short-lived ticket signed with a key it shares only with the run's shards; the
shard checks the signature and the ticket's fields and nothing else.

Format (text, safe in gRPC metadata): ``<payload>.<mac>``, both URL-safe base64 without
padding. ``payload`` is compact JSON ``{"run": str, "robot": int, "name": str, "shard": int,
"exp": float}`` (``exp``: expiry, unix seconds); ``mac`` is HMAC-SHA256 of the payload's
bytes under the run's ticket key (32 random bytes, :func:`new_key`).

A robot sends its ticket as ``authorization: Bearer <ticket>`` and its robot id as
``robofleet-robot: <id>`` (:func:`ticket_metadata`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass

from comms.wire.credentials import credential_metadata

ROBOT_HEADER = "robofleet-robot"
KEY_BYTES = 32


class TicketError(PermissionError):
    """A ticket the shard refuses; ``str`` names what was wrong (missing, malformed,
    signature, run, shard, robot, expired)."""


@dataclass(frozen=True)
class Ticket:
    """What a ticket says: robot ``robot_id`` (named ``name``) may upload steps of run
    ``run_id`` to shard ``shard`` until ``expires_at`` (unix seconds)."""

    run_id: str
    robot_id: int
    name: str
    shard: int
    expires_at: float


def new_key() -> bytes:
    """A fresh ticket key (``KEY_BYTES`` random bytes)."""
    return secrets.token_bytes(KEY_BYTES)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(key: bytes, payload: bytes) -> bytes:
    return hmac.new(key, payload, hashlib.sha256).digest()


def issue(key: bytes, ticket: Ticket) -> str:
    """``ticket`` signed with ``key``, as text (module docstring)."""
    payload = json.dumps(
        {
            "run": ticket.run_id,
            "robot": ticket.robot_id,
            "name": ticket.name,
            "shard": ticket.shard,
            "exp": ticket.expires_at,
        },
        separators=(",", ":"),
    ).encode()
    return f"{_b64(payload)}.{_b64(_mac(key, payload))}"


def verify(
    key: bytes,
    text: str | None,
    *,
    run_id: str,
    shard: int,
    robot_id: int | None,
    now: float | None = None,
) -> Ticket:
    """The ticket in ``text`` when it is signed with ``key`` and lets its robot upload to
    shard ``shard`` of run ``run_id`` now; ``robot_id``: the id the caller says it has.

    Raises:
        TicketError: no ticket; not a ticket; a wrong signature; for another run, shard or
            robot; expired (each named, with the values).
    """
    if not text:
        raise TicketError("missing shard ticket (authorization: Bearer <ticket>)")
    head, dot, tail = text.partition(".")
    try:
        if not (head and dot and tail):
            raise ValueError("no signature")
        payload, mac = _unb64(head), _unb64(tail)
    except (binascii.Error, ValueError):
        raise TicketError("malformed shard ticket (not <payload>.<signature>)") from None
    if not hmac.compare_digest(mac, _mac(key, payload)):
        raise TicketError("shard ticket has a wrong signature (not issued for this run's shards)")
    try:
        fields = json.loads(payload)
        got = Ticket(
            str(fields["run"]),
            int(fields["robot"]),
            str(fields["name"]),
            int(fields["shard"]),
            float(fields["exp"]),
        )
    except (ValueError, KeyError, TypeError):
        raise TicketError("malformed shard ticket payload") from None
    if got.run_id != run_id:
        raise TicketError(f"shard ticket is for run {got.run_id!r}; this shard serves {run_id!r}")
    if got.shard != shard:
        raise TicketError(f"shard ticket is for shard {got.shard}; this is shard {shard}")
    if robot_id is None or got.robot_id != robot_id:
        said = "no robot id" if robot_id is None else f"robot {robot_id}"
        raise TicketError(f"shard ticket is for robot {got.robot_id}; the caller sent {said}")
    t = time.time() if now is None else now
    if got.expires_at <= t:
        raise TicketError(f"shard ticket expired {t - got.expires_at:.1f} s ago")
    return got


def ticket_metadata(ticket: str, robot_id: int) -> tuple[tuple[str, str], ...]:
    """gRPC call metadata carrying ``ticket`` and the robot's id."""
    return (*credential_metadata(ticket), (ROBOT_HEADER, str(robot_id)))


def robot_from(metadata: Sequence[tuple[str, str | bytes]] | None) -> int | None:
    """The robot id a caller sent (``ROBOT_HEADER``), None when absent or not an integer."""
    for key, value in metadata or ():
        if key == ROBOT_HEADER:
            v = value.decode() if isinstance(value, bytes) else value
            try:
                return int(v)
            except ValueError:
                return None
    return None
