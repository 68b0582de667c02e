"""The client side of the ZeroMQ data plane (see :mod:`comms.cloud.dataplane`): connect, prove the
gRPC stream with its token, and give up quickly when the endpoint cannot be reached, so the
caller keeps using gRPC bytes.
"""

from __future__ import annotations

import logging

import zmq

from comms.proto import robofleet_pb2 as pb
from comms.wire.dataplane_frames import HELLO, OK

log = logging.getLogger(__name__)

RECEIVE_QUEUE_MESSAGES = 32  # weight chunks (<= 1 MiB each) queued in the robot's socket at most


def connect(
    offer: pb.DataPlane, handshake_s: float, *, require_curve: bool = False
) -> zmq.Socket[bytes] | None:
    """A DEALER socket bound to the offering gRPC stream, or None when the data plane did not
    answer within ``handshake_s`` or refused the token.

    Args:
        offer: the server's ``pb.DataPlane`` (received on the authenticated gRPC stream).
        handshake_s: how long to wait for the server's answer.
        require_curve: refuse a plaintext offer (the gRPC channel uses TLS).
    """
    if not offer.endpoint or len(offer.token) != 32:
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
    if offer.curve_server_key:
        if not zmq.has("curve"):
            sock.close(0)
            return None
        public, secret = zmq.curve_keypair()  # ephemeral: the token authenticates, not the key
        sock.setsockopt(zmq.CURVE_SERVERKEY, offer.curve_server_key)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
    try:
        sock.connect(offer.endpoint)
        sock.send_multipart([HELLO, offer.token])
        if sock.poll(int(handshake_s * 1000)) and sock.recv() == OK:
            return sock
    except zmq.ZMQError as exc:
        log.info("data plane %s unusable: %s", offer.endpoint, exc)
    log.info("data plane %s did not answer; using gRPC bytes", offer.endpoint)
    sock.close(0)
    return None
