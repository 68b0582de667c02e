"""``robofleet relay``: run a site relay until interrupted.

Beyond loopback the relay refuses to serve in the clear (gRPC without TLS; its ZeroMQ weight
fan-out is never encrypted) unless ``insecure_network`` is set, and then names each plaintext
server at every start (``comms.exposure``); exit code 2 on refusal.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="robofleet relay",
        description="Site relay: forwards the site's uploads and fans weights out over ZeroMQ.",
    )
    parser.add_argument("--config", default=None, help="YAML settings file")
    parser.add_argument("--cloud", default=None, help="cloud gRPC host:port (comms.cloud_address)")
    parser.add_argument(
        "--port", type=int, default=None, help="gRPC port for robots (comms.relay_port)"
    )
    parser.add_argument(
        "--zmq-port", type=int, default=None, help="ZeroMQ PUB port (comms.relay_zmq_port)"
    )
    parser.add_argument(
        "--bind", default=None, help="address to bind (comms.bind_host, default loopback)"
    )
    parser.add_argument(
        "--cloud-ca", type=Path, default=None, help="PEM root that signs the cloud's TLS cert"
    )
    args = parser.parse_args(list(argv))

    from robofleet.settings import load_settings

    settings = load_settings(args.config)
    comms = settings.comms
    if args.bind:
        comms = comms.model_copy(update={"bind_host": args.bind})
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    from comms.exposure import relay_plaintext_servers
    from comms.relay.site_relay import SiteRelay

    port = comms.relay_port if args.port is None else args.port
    zmq_port = comms.relay_zmq_port if args.zmq_port is None else args.zmq_port
    plaintext = relay_plaintext_servers(comms, port, zmq_port)
    if plaintext and not settings.insecure_network:
        print(
            "robofleet relay: refusing to serve beyond loopback in the clear: "
            + "; ".join(plaintext)
            + ". Set comms.tls_cert_file/tls_key_file, bind to 127.0.0.1, or set "
            "insecure_network: true (ROBOFLEET_INSECURE_NETWORK=true) to accept it",
            file=sys.stderr,
            flush=True,
        )
        return 2

    relay = SiteRelay(
        comms,
        cloud_address=args.cloud,
        port=args.port,
        zmq_port=args.zmq_port,
        cloud_ca=args.cloud_ca,
    )
    port, zmq_port = relay.start()
    print(
        f"relay serving robots on {comms.bind_host}:{port} (zmq {zmq_port}) -> cloud {relay.cloud_address}",
        flush=True,
    )
    for server in plaintext:
        print(f"robofleet relay: insecure_network: {server}", flush=True)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    relay.stop()
    return 0
