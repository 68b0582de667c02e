"""The client side of the ZeroMQ data plane (see :mod:`comms.cloud.dataplane`): connect, prove the
gRPC stream with its token, and give up quickly when the endpoint cannot be reached, so the
caller keeps using gRPC bytes.

A cloud that binds every interface (``comms.bind_host: 0.0.0.0``) and names no
``comms.data_advertise_host`` offers a wildcard host (``tcp://0.0.0.0:50052``): the robot dials
its data plane at the host it dialed for gRPC, the one name of the cloud it knows to work.
"""

from __future__ import annotations

import logging

import zmq

from comms.proto import robofleet_pb2 as pb
from comms.wire.dataplane_frames import HELLO, OK, WILDCARD_HOSTS

log = logging.getLogger(__name__)

_GRPC_SCHEMES = ("dns:///", "dns:", "ipv4:", "ipv6:")

RECEIVE_QUEUE_MESSAGES = 32  # weight chunks (<= 1 MiB each) queued in the robot's socket at most


def grpc_host(target: str) -> str | None:
    """The host of a gRPC target (``host:port``, ``[v6]:port``, ``dns:///host:port``,
    ``ipv4:a.b.c.d:port``; a bare ``host``), IPv6 in brackets; None for one that names no
    TCP host (``unix:``, several addresses, a bare IPv6 without brackets)."""
    for scheme in _GRPC_SCHEMES:
        if target.startswith(scheme):
            target = target.removeprefix(scheme)
            break
    if not target or "/" in target or "," in target or target.startswith("unix:"):
        return None
    if target.startswith("["):
        end = target.find("]")
        return target[: end + 1] if end > 1 else None
    if target.count(":") > 1:
        return None
    host = target.partition(":")[0]
    return host or None


def is_host_port(target: str) -> bool:
    """``target`` names a TCP host and an explicit numeric port (``host:port``, ``[v6]:port``,
    ``dns:///host:port``), as :func:`grpc_host` reads it."""
    return grpc_host(target) is not None and target.rpartition(":")[2].isdigit()


def reachable_endpoint(endpoint: str, dialed: str | None) -> str | None:
    """``endpoint`` (``tcp://host:port``) as this robot dials it: a wildcard host is replaced
    by the host of ``dialed`` (the gRPC target the offer came through); None when it is a
    wildcard and ``dialed`` names no host (nothing to dial)."""
    scheme, sep, rest = endpoint.partition("://")
    host, colon, port = rest.rpartition(":")
    if not sep or not colon or host not in WILDCARD_HOSTS:
        return endpoint
    substitute = grpc_host(dialed) if dialed else None
    if substitute is None:
        return None
    return f"{scheme}://{substitute}:{port}"


def connect(
    offer: pb.DataPlane,
    handshake_s: float,
    *,
    require_curve: bool = False,
    dialed: str | None = None,
) -> zmq.Socket[bytes] | None:
    """A DEALER socket bound to the offering gRPC stream, or None when the data plane did not
    answer within ``handshake_s`` or refused the token, or when its host is a wildcard and
    ``dialed`` names none (returned at once: no handshake is waited out).

    Args:
        offer: the server's ``pb.DataPlane`` (received on the authenticated gRPC stream).
        handshake_s: how long to wait for the server's answer, in seconds.
        require_curve: refuse a plaintext offer (the gRPC channel uses TLS).
        dialed: the gRPC target (``host:port``) the offer came through: its host replaces a
            wildcard host in the offer.
    """
    if not offer.endpoint or len(offer.token) != 32:
        return None
    endpoint = reachable_endpoint(offer.endpoint, dialed)
    if endpoint is None:
        log.info(
            "data plane offered at %s and the gRPC address is unknown; using gRPC bytes "
            "(the cloud can name its host with comms.data_advertise_host)",
            offer.endpoint,
        )
        return None
    if require_curve and not offer.curve_server_key:
        log.warning("plaintext data plane offered on a TLS channel; using gRPC bytes")
        return None
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    # Received chunks wait here until the subscription has staged them. Bounded, so a robot
    # that copies and hashes slower than the link delivers (loopback, a fast LAN) holds a few
    # MiB of them, not a whole version beside the one it stages: when it is full, libzmq stops
    # reading the connection and the server's ROUTER waits (ROUTER_MANDATORY: nothing dropped).
    sock.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE_MESSAGES)
    # A DEALER blocks sending while it has no peer: a server that went away must not hang
    # the sender for good (it gives up with zmq.Again and reconnects over gRPC).
    sock.setsockopt(zmq.SNDTIMEO, max(1, int(handshake_s * 1000)))
    if "://[" in endpoint:
        sock.setsockopt(zmq.IPV6, 1)
    if offer.curve_server_key:
        if not zmq.has("curve"):
            sock.close(0)
            return None
        public, secret = zmq.curve_keypair()  # ephemeral: the token authenticates, not the key
        sock.setsockopt(zmq.CURVE_SERVERKEY, offer.curve_server_key)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
    try:
        sock.connect(endpoint)
        sock.send_multipart([HELLO, offer.token])
        if sock.poll(int(handshake_s * 1000)) and sock.recv() == OK:
            return sock
    except zmq.ZMQError as exc:
        log.info("data plane %s unusable: %s", endpoint, exc)
    log.info("data plane %s did not answer; using gRPC bytes", endpoint)
    sock.close(0)
    return None
