"""A buffer shard's own ingest endpoint: the cloud's upload protocol, served in the shard's
process, appending straight into the shard's buffer.

The endpoint registers the cloud's Experience servicer (``comms.cloud.services.experience``:
the same validation against the run's schema, the same refusal rules, acks after the
shard's fdatasync) and, when ``comms.data_plane`` is on, the same ZeroMQ data plane, on the
shard node's address: each on a port the OS picks, or both on free ports of the range
``comms.shard_ingest_port`` starts (two a shard; ``comms.cloud.shard_ports``), the ones it
held when the shard last ran first when they are free.
TLS is on with the cloud's certificate settings (``comms.tls_cert_file``; the data plane is
then CURVE-encrypted); beyond loopback without TLS the endpoint is refused unless the
cloud's ``insecure_network`` is set, and then it names itself in the log as plaintext.

Callers authenticate with a shard ticket (``comms.wire.tickets``) instead of their robot
credential: :class:`TicketAuth` checks its signature under the run's ticket key and that it
names this run, this shard and the calling robot, and has not expired; a refusal is
UNAUTHENTICATED with the reason. A ticket is checked when a stream opens (as the cloud checks
a lease), so a lease that ends stops new streams within the ticket's lifetime.
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc.aio

from comms.cloud.auth import AuthError, Metadata, RobotIdentity
from comms.cloud.loop_thread import LoopThread
from comms.cloud.server import stop_serving
from comms.cloud.services.common import ServerState, server_options
from comms.cloud.services.experience import ExperienceServicer
from comms.cloud.services.requests import add_service
from comms.cloud.shard_ports import bind_dataplane, ingest_range, range_full
from comms.cloud.shard_ports import ports_to_try as ports_to_try
from comms.cloud.step_sink import StepSink
from comms.config import CommsSettings
from comms.exposure import is_loopback
from comms.wire import tickets, tls
from comms.wire.credentials import credential_from
from foundation.durable import atomic_write_text

log = logging.getLogger(__name__)


class InsecureEndpoint(RuntimeError):
    """A shard endpoint would listen beyond loopback in plaintext without ``insecure_network``."""


class TicketAuth:
    """``comms.cloud.auth.CallerAuth`` of shard ``shard`` of run ``run_id``: shard tickets
    signed with ``key`` (the run's ticket key)."""

    def __init__(self, key: bytes, run_id: str, shard: int) -> None:
        self.key, self.run_id, self.shard = key, run_id, shard

    def identify_call(self, metadata: Metadata | None) -> RobotIdentity:
        """The robot a valid ticket in ``metadata`` names.

        Raises:
            AuthError: (unauthenticated) the ticket is missing, malformed, wrongly signed,
                for another run, shard or robot, or expired (named).
        """
        try:
            t = tickets.verify(
                self.key,
                credential_from(metadata),
                run_id=self.run_id,
                shard=self.shard,
                robot_id=tickets.robot_from(metadata),
            )
        except tickets.TicketError as exc:
            raise AuthError(str(exc), unauthenticated=True) from None
        return RobotIdentity(t.robot_id, t.name, "")

    def require_lease(self, ident: RobotIdentity, run_id: str) -> None:
        """Raises AuthError (permission denied) for a run other than this shard's."""
        if run_id != self.run_id:
            raise AuthError(
                f"this ingest endpoint serves run {self.run_id!r}, not {run_id!r}",
                unauthenticated=False,
            )


class EndpointEvents:
    """The run events an endpoint records (``buffer.disk_full``, ``buffer.disk_recovered``:
    ``comms.cloud.services.sink_events``), each numbered ``n`` from 0 in this process and
    tagged with the shard, until the cloud records them from the shard's figures
    (``runs.sharded.new_endpoint_events``). The newest ``keep`` are kept."""

    def __init__(self, shard: int, keep: int = 100) -> None:
        self.shard, self.keep = shard, keep
        self._lock = threading.Lock()
        self._events: list[dict[str, Any]] = []
        self._n = 0

    def record_event(self, kind: str, *, run_id: str | None = None, **data: Any) -> None:
        log.warning("run %s shard %d: %s %s", run_id, self.shard, kind, data)
        with self._lock:
            self._events.append({"n": self._n, "kind": kind, "data": {**data, "shard": self.shard}})
            self._n += 1
            del self._events[: -self.keep]

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(e) for e in self._events]


class ShardIngestServer:
    """The ingest endpoint of shard ``shard`` of run ``run_id`` (module docstring).

    Args:
        settings: the cloud's ``comms`` settings (TLS files, limits, timeouts, data plane).
        sink: the shard's buffer as a step sink (``ReplayBufferSink``).
        run_id / shard: what it serves.
        key: the run's ticket key.
        host: the node's address it binds (robots reach it there, or at the address
            ``comms.shard_advertise_hosts`` names for it).
        port: the gRPC port to try first (0: any); a taken one falls back to any, or to the
            range ``settings.shard_ingest_port`` starts when that is set (:func:`ports_to_try`).
        data_port: the same for the data plane's port.
        insecure_network: plaintext beyond loopback is accepted (and logged).
    """

    def __init__(
        self,
        settings: CommsSettings,
        sink: StepSink,
        run_id: str,
        shard: int,
        key: bytes,
        host: str,
        port: int = 0,
        data_port: int = 0,
        insecure_network: bool = False,
    ) -> None:
        self.insecure_network = insecure_network
        # Robots may reach the node at another address than the one it binds (NAT, DNS).
        self.advertised = settings.shard_advertise_hosts.get(host, host)
        self.settings = settings.model_copy(
            update={"bind_host": host, "data_port": 0, "data_advertise_host": self.advertised}
        )
        self.run_id, self.shard, self.host = run_id, shard, host
        self.state = ServerState(
            settings=self.settings,
            store=None,
            auth=TicketAuth(key, run_id, shard),
            sinks=lambda asked: sink if asked == run_id else None,
            events=EndpointEvents(shard),
        )
        self._want_port, self._want_data_port = port, data_port
        self._loop: LoopThread | None = None
        self._server: grpc.aio.Server | None = None
        self.port = 0

    @property
    def address(self) -> str:
        """``host:port`` robots upload to (the host as ``comms.shard_advertise_hosts``
        names the node, else the one it binds)."""
        return f"{self.advertised}:{self.port}"

    @property
    def data_port(self) -> int:
        """The data plane's port; 0 when none is offered."""
        dp = self.state.dataplane
        return dp.port if dp is not None else 0

    @property
    def tls(self) -> bool:
        return self.settings.tls_cert_file is not None

    def start(self) -> int:
        """Bind and serve; returns the bound port.

        Raises:
            InsecureEndpoint: ``host`` is beyond loopback, TLS is off and
                ``insecure_network`` is not set.
            PortRangeFull: a range is set (``comms.shard_ingest_port``) and it has no free
                port for the gRPC server or the data plane (the range and settings named).
            RuntimeError: no port could be bound on ``host``, or a TLS certificate without
                its key.
        """
        if not self.tls and not is_loopback(self.host):
            if not self.insecure_network:
                raise InsecureEndpoint(
                    f"shard {self.shard}'s ingest endpoint would listen on {self.host} without "
                    "TLS: set comms.tls_cert_file and comms.tls_key_file, or insecure_network: "
                    "true to accept plaintext"
                )
            log.warning(
                "insecure_network: shard %d ingest on %s in plaintext (tickets and steps)",
                self.shard,
                self.host,
            )
        self._loop = LoopThread(f"shard-{self.shard}-ingest")
        self.state.loop = self._loop.loop
        self.state.ingest_pool = ThreadPoolExecutor(
            max_workers=min(32, (os.cpu_count() or 1) + 4), thread_name_prefix="shard-ingest"
        )
        try:
            # The data plane first: the servicer offers it from the first stream on.
            self.state.dataplane = bind_dataplane(
                self.settings, self._want_data_port, avoid=self._want_port
            )
            self.port = self._loop.run(self._start())
        except BaseException:
            self.stop()
            raise
        log.info(
            "shard %d ingest on %s, data plane port %d (tls=%s)",
            self.shard,
            self.address,
            self.data_port,
            self.tls,
        )
        return self.port

    async def _start(self) -> int:
        s = self.settings
        for port in ports_to_try(s, self._want_port, avoid=self._want_data_port):
            server = grpc.aio.server(
                options=server_options(s), maximum_concurrent_rpcs=s.max_concurrent_streams
            )
            add_service(server, ExperienceServicer(self.state), "Experience")
            target = f"{self.host}:{port}"
            try:
                if s.tls_cert_file is not None:
                    if s.tls_key_file is None:
                        raise RuntimeError(
                            "comms.tls_cert_file is set but comms.tls_key_file is not"
                        )
                    creds = tls.server_credentials(s.tls_cert_file, s.tls_key_file)
                    bound = server.add_secure_port(target, creds)
                else:
                    bound = server.add_insecure_port(target)
            except RuntimeError as exc:
                if "tls_key_file" in str(exc):
                    raise
                bound = 0  # grpc raises when the port is taken
            if bound:
                await server.start()
                self._server = server
                return bound
        if ingest_range(s):
            raise range_full("ingest endpoint (gRPC)", self.host, s)
        raise RuntimeError(f"cannot bind the shard ingest endpoint on {self.host}")

    def figures(self) -> dict[str, Any]:
        """``address``, ``rows`` (stored through this endpoint), ``streams`` (open now),
        ``data_plane_batches``, ``tls``, ``events`` (:class:`EndpointEvents`)."""
        dp = self.state.dataplane
        events = self.state.events
        assert isinstance(events, EndpointEvents)
        return {
            "address": self.address,
            "rows": self.state.uploaded_rows,
            "streams": self.state.active_streams,
            "data_plane_batches": dp.batches_received if dp is not None else 0,
            "tls": self.tls,
            "events": events.snapshot(),
        }

    def stop(self) -> None:
        """Stop serving (open streams are cancelled) and let go of the port."""
        loop, server = self._loop, self._server
        self._loop = self._server = None
        stop_serving(self.state, loop, server)


PORT_FILE = "ingest_port"  # the gRPC port, in the shard's directory
DATA_PORT_FILE = "ingest_data_port"  # the data plane's


def _kept(path: Path) -> int:
    return int(path.read_text()) if path.exists() else 0


def _keep(path: Path, port: int) -> None:
    if port and _kept(path) != port:
        atomic_write_text(path, str(port))


class ShardIngest:
    """Starts a shard's :class:`ShardIngestServer` in the shard's process: a
    ``buffer.service.shard_actor.EndpointFactory`` (picklable; Ray runs it again in a
    restarted shard, which binds the ports it had when they are free, else others).

    Args:
        settings: the cloud's ``comms`` settings.
        run_id: the run.
        key: the run's ticket key.
        host: the address to bind; None: the shard node's IP as Ray knows it.
        insecure_network: the cloud's ``insecure_network`` (plaintext beyond loopback).
    """

    def __init__(
        self,
        settings: CommsSettings,
        run_id: str,
        key: bytes,
        host: str | None = None,
        insecure_network: bool = False,
    ) -> None:
        self.settings, self.run_id, self.key, self.host = settings, run_id, key, host
        self.insecure_network = insecure_network

    def __call__(self, buffer: Any, k: int, directory: Path) -> ShardIngestServer:
        """The started endpoint of shard ``k`` over ``buffer`` (an open ``ReplayBuffer``).

        Raises:
            InsecureEndpoint / PortRangeFull / RuntimeError: as
                :meth:`ShardIngestServer.start`.
        """
        from comms.cloud.replay_buffer_sink import ReplayBufferSink

        host = self.host
        if host is None:
            import ray

            host = ray.util.get_node_ip_address()
        grpc_file, data_file = directory / PORT_FILE, directory / DATA_PORT_FILE
        server = ShardIngestServer(
            self.settings,
            ReplayBufferSink(buffer),
            self.run_id,
            k,
            self.key,
            host,
            _kept(grpc_file),
            _kept(data_file),
            insecure_network=self.insecure_network,
        )
        server.start()
        _keep(grpc_file, server.port)
        _keep(data_file, server.data_port)
        return server
