"""Which of a site's servers would carry secrets in the clear beyond this machine.

A server bound to loopback never leaves the host; bound to any other address, what it
carries (enrollment tokens, credentials, steps, weights) crosses the network. The cloud's
checks (``dashboard.exposure``) and the site relay's (:func:`relay_plaintext_servers`) both
start from :func:`is_loopback`.
"""

from __future__ import annotations

import ipaddress

from comms.config import CommsSettings


def is_loopback(host: str) -> bool:
    """``host`` is a loopback address or ``localhost`` (a host name may resolve to anything:
    not loopback)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def relay_plaintext_servers(comms: CommsSettings, port: int, zmq_port: int) -> list[str]:
    """One line per server of a site relay that would listen beyond loopback in the clear.

    The relay serves robots over gRPC (TLS with ``comms.tls_cert_file``) and fans weights
    out on a ZeroMQ PUB socket, which has no encryption or authentication: beyond loopback
    anyone on the site network can read the weights from it, so it is always named there.

    Args:
        comms: the relay's settings (``bind_host``, TLS files).
        port / zmq_port: the relay's gRPC and ZeroMQ ports.
    """
    if is_loopback(comms.bind_host):
        return []
    out = []
    if comms.tls_cert_file is None:
        out.append(f"relay gRPC on {comms.bind_host}:{port} without TLS (comms.tls_cert_file)")
    out.append(f"relay weight fan-out (ZeroMQ) on {comms.bind_host}:{zmq_port} unencrypted")
    return out
