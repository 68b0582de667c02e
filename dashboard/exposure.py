"""Which of the cloud's servers would carry secrets in the clear beyond this machine.

Enrollment tokens, robot credentials, steps, weights and dashboard sessions cross the gRPC
server, its ZeroMQ data plane and the dashboard. Bound to loopback they never leave the host;
bound to any other address they need TLS (``comms.tls_cert_file``: gRPC, and CURVE on the data
plane; ``dashboard.tls_cert_file``: HTTPS). ``insecure_network: true`` is the explicit way to
serve in the clear anyway (a private test network); the cloud then names every such server in
its log and the dashboard shows it on every page.
"""

from __future__ import annotations

from comms.config import CommsSettings
from comms.exposure import is_loopback
from dashboard.config import DashboardSettings


class InsecureNetworkError(RuntimeError):
    """A server would listen beyond loopback without TLS and ``insecure_network`` is off."""


def plaintext_servers(comms: CommsSettings, dashboard: DashboardSettings | None) -> list[str]:
    """One line per server that would listen beyond loopback without TLS (empty: none).

    Args:
        comms: the gRPC server's (and its data plane's) settings.
        dashboard: the dashboard's, None when the cloud serves no dashboard.
    """
    out = []
    if not is_loopback(comms.bind_host) and comms.tls_cert_file is None:
        out.append(f"gRPC on {comms.bind_host}:{comms.grpc_port} without TLS (comms.tls_cert_file)")
        if comms.data_plane:
            out.append(f"the ZeroMQ data plane on {comms.bind_host} unencrypted (follows gRPC)")
    if (
        dashboard is not None
        and not is_loopback(dashboard.bind_host)
        and dashboard.tls_cert_file is None
    ):
        out.append(
            f"the dashboard on {dashboard.bind_host}:{dashboard.port} over plain HTTP "
            "(dashboard.tls_cert_file)"
        )
    return out


def check_exposure(
    comms: CommsSettings, dashboard: DashboardSettings | None, insecure_network: bool
) -> list[str]:
    """The plaintext servers the cloud may start with (:func:`plaintext_servers`).

    Raises:
        InsecureNetworkError: any, and ``insecure_network`` is off; the message names each
            and the two ways out (TLS, or the explicit flag).
    """
    servers = plaintext_servers(comms, dashboard)
    if servers and not insecure_network:
        raise InsecureNetworkError(
            "refusing to serve beyond loopback in the clear: "
            + "; ".join(servers)
            + ". Set the TLS files, bind to 127.0.0.1, or set insecure_network: true "
            "(ROBOFLEET_INSECURE_NETWORK=true) to accept it"
        )
    return servers
