"""The cloud gRPC server: every edge-facing service on one port, hosted on its own event loop.

Usage (cloud process)::

    server = CloudServer(settings.comms, store, sinks=lambda run_id: buffers.get(run_id))
    port = server.start()
    dist = server.distributor(run_id)       # new weight versions are published here
    server.push_control(robot_id, "estop")  # pushed to the robot's Control stream
    server.stop()
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import grpc.aio

from comms.cloud import allocator
from comms.cloud.auth import Authenticator
from comms.cloud.dataplane import DataPlaneServer, curve_available
from comms.cloud.distributor import WeightDistributor
from comms.cloud.loop_thread import LoopThread
from comms.cloud.ratelimit import AsyncByteRate
from comms.cloud.services import add_servicers
from comms.cloud.services.common import ActHandler, ServerState, server_options
from comms.cloud.services.control import control_command
from comms.cloud.services.station import StationView
from comms.cloud.shard_routes import RouteResolver
from comms.cloud.step_sink import SinkResolver, StepSink
from comms.config import CommsSettings
from comms.exposure import is_loopback
from comms.proto import robofleet_pb2 as pb
from comms.wire import tls
from comms.wire.dataplane_frames import WILDCARD_HOSTS
from foundation.store.metadata_store import MetadataStore

log = logging.getLogger(__name__)

CONTROL_KINDS = {
    "estop": pb.ControlCommand.ESTOP,
    "pause": pb.ControlCommand.PAUSE,
    "resume": pb.ControlCommand.RESUME,
    "lease_changed": pb.ControlCommand.LEASE_CHANGED,
    "clear_estop": pb.ControlCommand.CLEAR_ESTOP,
    "assign": pb.ControlCommand.ASSIGN,
    "release": pb.ControlCommand.RELEASE,
    "rerecord": pb.ControlCommand.RERECORD,
    "discard": pb.ControlCommand.DISCARD,
    "ready": pb.ControlCommand.READY,
    "help_answered": pb.ControlCommand.HELP_ANSWERED,
    "teleop": pb.ControlCommand.TELEOP,
}


class CloudServer:
    """Enrollment, Experience, Episodes, Weights, Heartbeat, Control and Act services.

    Args:
        settings: the ``comms`` settings (bind host, port, TLS files, timeouts, bandwidth cap).
        store: the metadata store (credentials, leases, heartbeats).
        sinks: a single :class:`StepSink` for every run, or ``run_id -> sink or None``.
        act_handler: remote policy for the Act service (None answers UNIMPLEMENTED).
        routes: a sharded run's ingest routes by run id (``Ingest.Route``; default none).
        port: overrides ``settings.grpc_port`` (0 = any free port).
    """

    def __init__(
        self,
        settings: CommsSettings,
        store: MetadataStore,
        sinks: StepSink | SinkResolver,
        *,
        act_handler: ActHandler | None = None,
        port: int | None = None,
        routes: RouteResolver | None = None,
    ) -> None:
        resolver: SinkResolver
        if isinstance(sinks, StepSink):
            single = sinks
            resolver = lambda _run_id: single  # noqa: E731
        else:
            resolver = sinks
        self.settings = settings
        self._auth = Authenticator(store, settings.auth_cache_s)
        self.state = ServerState(
            settings=settings,
            store=store,
            auth=self._auth,
            sinks=resolver,
            act_handler=act_handler,
        )
        if routes is not None:
            self.state.routes = routes
        self._port = settings.grpc_port if port is None else port
        self._loop: LoopThread | None = None
        self._server: grpc.aio.Server | None = None
        self.port = 0

    @property
    def address(self) -> str:
        return f"{self.settings.bind_host}:{self.port}"

    def start(self) -> int:
        """Bind and serve; returns the bound port.

        Raises:
            RuntimeError: the port could not be bound.
        """
        self._loop = LoopThread("comms-cloud")
        self.state.loop = self._loop.loop
        self.state.dataplane = start_dataplane(self.settings)
        # As many threads as asyncio's default executor: robots' fsyncs overlap.
        self.state.ingest_pool = ThreadPoolExecutor(
            max_workers=min(32, (os.cpu_count() or 1) + 4), thread_name_prefix="ingest"
        )
        self.port = self._loop.run(self._start())
        log.info(
            "cloud gRPC server on %s (tls=%s)",
            self.address,
            self.settings.tls_cert_file is not None,
        )
        return self.port

    async def _start(self) -> int:
        s = self.settings
        self.state.rate = AsyncByteRate(s.weight_max_bytes_per_s)
        server = grpc.aio.server(
            options=server_options(s), maximum_concurrent_rpcs=s.max_concurrent_streams
        )
        add_servicers(server, self.state)
        target = f"{s.bind_host}:{self._port}"
        if s.tls_cert_file is not None:
            if s.tls_key_file is None:
                raise RuntimeError("comms.tls_cert_file is set but comms.tls_key_file is not")
            port = server.add_secure_port(
                target, tls.server_credentials(s.tls_cert_file, s.tls_key_file)
            )
        else:
            port = server.add_insecure_port(target)
        if port == 0:
            raise RuntimeError(f"cannot bind gRPC server to {target}")
        await server.start()
        self._server = server
        return port

    def stop(self, grace_s: float = 0.0) -> None:
        """Stop serving (open streams are cancelled after ``grace_s``). Distributors keep running."""
        loop, server = self._loop, self._server
        self._loop = self._server = None
        stop_serving(self.state, loop, server, grace_s)

    def close(self) -> None:
        """Stop and close every distributor."""
        self.stop()
        for dist in self.state.distributors.values():
            dist.close()

    def run_sink(self, run_id: str) -> StepSink | None:
        """The sink a run's uploads and episode marks go to here, or None when this cloud
        does not hold the run (the dashboard's episode labels take the same path)."""
        return self.state.sinks(run_id)

    def distributor(self, run_id: str) -> WeightDistributor:
        """The run's weight distributor (created on first use)."""
        return self.state.distributor(run_id)

    def attach_distributor(self, dist: WeightDistributor) -> None:
        """Serve an existing distributor (e.g. one kept across a server restart)."""
        self.state.attach(dist)

    def push_control(
        self,
        robot_id: int,
        kind: str,
        run_id: str = "",
        reason: str = "",
        assignment: str = "",
        teleop: str = "",
    ) -> bool:
        """Queue a command on the robot's Control stream; returns False when it is not connected.

        ``assignment`` (``assign`` only) is the run's ``edge_agent.assignment.Assignment`` as JSON;
        ``teleop`` (``teleop`` only) one station command as JSON (``edge_agent.remote``).

        Raises:
            ValueError: ``kind`` is not one of :data:`CONTROL_KINDS` (estop, pause, resume,
                lease_changed, clear_estop, assign, release, rerecord, discard, ready,
                help_answered, teleop).
        """
        if kind not in CONTROL_KINDS:
            raise ValueError(f"unknown control kind {kind!r} (allowed: {', '.join(CONTROL_KINDS)})")
        if self._loop is None:
            return False

        async def push() -> bool:
            q = self.state.control.get(robot_id)
            if q is None:
                return False
            if q.full():
                q.get_nowait()  # drop the oldest; the newest command is what matters
            cmd = control_command(
                self.state, CONTROL_KINDS[kind], run_id, reason, assignment, teleop
            )
            q.put_nowait(cmd)
            return True

        return self._loop.run(push())

    def push_teleop(self, robot_id: int, command: str, run_id: str = "") -> bool:
        """Queue one station command (JSON, ``edge_agent.remote``) for the robot; False when
        it is not connected."""
        return self.push_control(robot_id, "teleop", run_id, "station", teleop=command)

    def station_view(self, robot_id: int) -> StationView | None:
        """The robot's latest station report (frame, takeover, echo), None before any."""
        return self.state.station.get(robot_id)

    def stats(self) -> dict[str, Any]:
        """Counters: open streams, weight bytes sent, rows uploaded."""
        st = self.state
        dp = st.dataplane
        return {
            "active_streams": st.active_streams,
            "weight_bytes_sent": st.weight_bytes_sent + (dp.weight_bytes_sent if dp else 0),
            "data_plane_batches": dp.batches_received if dp else 0,
            "uploaded_rows": st.uploaded_rows,
        }

    def uploaded_rows(self, run_id: str) -> int:
        """Rows this server's upload streams stored into run ``run_id`` (its own ingest;
        a sharded run's robots upload to their shards' endpoints instead)."""
        return self.state.uploaded_rows_by_run.get(run_id, 0)

    @property
    def data_endpoint(self) -> str | None:
        """The ZeroMQ data plane's endpoint, None when none is offered."""
        dp = self.state.dataplane
        return dp.endpoint if dp is not None else None

    def invalidate_auth(self) -> None:
        """Re-read credentials and leases at the next call (after a revocation or lease change)."""
        self._auth.invalidate()


def stop_serving(
    state: ServerState,
    loop: LoopThread | None,
    server: grpc.aio.Server | None,
    grace_s: float = 0.0,
) -> None:
    """Tear down what a server's start set up, for the cloud's server and a shard's ingest
    endpoint alike: ``server`` (open streams cancelled after ``grace_s``), its ``loop``, and
    ``state``'s data plane and ingest pool. The caller clears its own attributes first, so
    that only local references to ``server`` are left, and none outlives ``loop``'s stop.
    """
    if loop is not None:
        if server is not None:
            loop.run(server.stop(grace_s))
        # grpc's poller lets go of its event loops when the last aio object is freed, from the
        # thread that frees it; under a running loop that closes the wake-up socket beneath the
        # loop's reader (an EBADF traceback). So the server goes once its loop has stopped.
        loop.stop()
        del server
    if state.dataplane is not None:
        state.dataplane.close()
        state.dataplane = None
    if state.ingest_pool is not None:
        state.ingest_pool.shutdown(wait=False, cancel_futures=True)
        state.ingest_pool = None


def start_dataplane(settings: CommsSettings) -> DataPlaneServer | None:
    """The server's ZeroMQ data plane on ``settings.data_port``, or None (turned off, TLS
    without CURVE in libzmq: then bytes stay on the encrypted gRPC streams rather than travel
    in plaintext, or the port cannot be bound: logged)."""
    if not dataplane_offered(settings):
        return None
    try:
        dp = new_dataplane(settings, settings.data_port)
    except RuntimeError as exc:
        log.error("no data plane: %s", exc)
        return None
    if advertised_host(settings) in WILDCARD_HOSTS:
        log.info(
            "data plane offered as %s: robots dial it at the host they dial for gRPC; set "
            "comms.data_advertise_host where that host does not reach port %d",
            dp.endpoint,
            dp.port,
        )
    if settings.data_port == 0 and not is_loopback(settings.bind_host):
        log.warning(
            "comms.data_port is 0: the data plane took port %d, another at the next start; "
            "set comms.data_port to open it in a firewall or Service (robots use gRPC bytes "
            "where it is closed)",
            dp.port,
        )
    return dp


def advertised_host(settings: CommsSettings) -> str:
    """The host the server's data-plane offers name: ``data_advertise_host``, else
    ``bind_host``."""
    return settings.data_advertise_host or settings.bind_host


def dataplane_offered(settings: CommsSettings) -> bool:
    """Whether a server under ``settings`` offers a data plane: ``data_plane`` is on, and
    libzmq has CURVE when TLS is on (logged when it lacks it). Tunes malloc for its messages
    when it is on (``tune_malloc``)."""
    if not settings.data_plane:
        return False
    if settings.tune_malloc:
        allocator.tune_for_messages()
    if settings.tls_cert_file is not None and not curve_available():
        log.warning("TLS is on but libzmq lacks CURVE: no data plane, bytes stay on gRPC")
        return False
    return True


def new_dataplane(settings: CommsSettings, port: int) -> DataPlaneServer:
    """A data plane bound to ``settings.bind_host`` on ``port`` (0: any free one), CURVE when
    TLS is on.

    Raises:
        RuntimeError: ``port`` is taken or the host cannot be bound (named).
    """
    return DataPlaneServer(
        settings.bind_host,
        port,
        advertise_host=advertised_host(settings),
        curve=settings.tls_cert_file is not None,
        max_bytes_per_s=settings.weight_max_bytes_per_s,
        max_message_bytes=settings.max_upload_batch_bytes,
    )
