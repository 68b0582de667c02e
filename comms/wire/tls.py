"""TLS for gRPC: server credentials from PEM files, client credentials trusting a root."""

from __future__ import annotations

from pathlib import Path

import grpc


def server_credentials(cert_file: Path, key_file: Path) -> grpc.ServerCredentials:
    """Server-side TLS from a PEM certificate chain and private key.

    Raises:
        FileNotFoundError: a file is missing.
    """
    return grpc.ssl_server_credentials([(key_file.read_bytes(), cert_file.read_bytes())])


def channel_credentials(ca_file: Path | None) -> grpc.ChannelCredentials:
    """Client-side TLS trusting ``ca_file`` (e.g. a self-signed server certificate), or the
    system roots when None."""
    return grpc.ssl_channel_credentials(ca_file.read_bytes() if ca_file else None)
