"""The cloud side in one process tree: Ray, comms' gRPC services, buffers, learners, run
manager, dashboard API, fleet liveness. ``robofleet cloud`` and ``robofleet demo`` run this.

Embedded default: a local Ray on loopback (``ray.init`` with a CPU count sized for the
machine), SQLite and run data in ``settings.data_dir``. With ``ray_address`` the same code joins
an existing Ray cluster (``ray.init(address=...)``) for the learners' resources. Robot
computers never need Ray: they dial the cloud's gRPC port and are assigned to runs over their
Control stream. The command that starts the cloud may hand it robot computers to keep
(``robots``: e.g. ``robofleet.sim.computers.sim_robots``), started once the gRPC port is open.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from dashboard.exposure import check_exposure
from foundation.store.metadata_store import MetadataStore, upgrade
from runs.manager import RunManager
from runs.pidfile import remove_pidfile, write_pidfile
from runs.run import CloudContext

log = logging.getLogger(__name__)
RAY_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"


class LocalRobots(Protocol):
    """Robot computers a cloud process keeps up while it runs; ``close`` stops them."""

    def close(self) -> None: ...


RobotStarter = Callable[[Any, MetadataStore, str], LocalRobots]
"""Starts robot computers: ``(settings, store, gRPC host:port) -> LocalRobots``, returning
once they enrolled and report (runs lease them). Raises RuntimeError when they do not."""


class CloudService:
    """Start with :meth:`start`, end with :meth:`close` (runs are left to resume next time).

    Args:
        settings: robofleet settings (``data_dir``, ``database_url``, sections).
        ray_address: join this Ray cluster; None starts a local one.
        num_cpus: logical CPUs of the local Ray (default: 2 per core, at least 4; bundles of
            learners and edge agents reserve them, the OS shares the real cores).
        robots: starts robot computers this process keeps (:data:`RobotStarter`), once the
            gRPC port is open and before runs resume; None: robots come on their own.
        dashboard_port: serve the dashboard/API here (None: no dashboard; 0: any port).
        grpc_port: comms port (default ``comms.grpc_port``; 0 = any).
        auto_resume: resume runs left running by a cloud that died.
    """

    def __init__(
        self,
        settings: Any,
        *,
        ray_address: str | None = None,
        num_cpus: int | None = None,
        robots: RobotStarter | None = None,
        dashboard_port: int | None = None,
        grpc_port: int | None = None,
        auto_resume: bool = True,
        eval_every_s: float | None = None,
    ) -> None:
        self.settings = settings
        self.ray_address = ray_address or settings.ray_address
        self.num_cpus = num_cpus or max(4, 2 * (os.cpu_count() or 2))
        self.start_robots = robots
        self.dashboard_port = dashboard_port
        self.grpc_port = grpc_port
        self.auto_resume = auto_resume
        self.eval_every_s = eval_every_s
        self.data_dir = Path(settings.data_dir)
        self.store: MetadataStore | None = None
        self.server: Any = None
        self.robots: LocalRobots | None = None
        self.manager: RunManager | None = None
        self.dashboard_url: str | None = None
        self.admin_login: tuple[str, str] | None = None
        self.plaintext_servers: list[str] = []
        self._uvicorn: Any = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._started_ray = False

    # -- start -----------------------------------------------------------------------------

    def start(self) -> CloudService:
        """Start every service (see the class docstring).

        Raises:
            dashboard.exposure.InsecureNetworkError: a server would listen beyond loopback
                without TLS and ``insecure_network`` is off (nothing was started).
        """
        import ray

        from comms.cloud.server import CloudServer

        s = self.settings
        exposed = check_exposure(
            s.comms, s.dashboard if self.dashboard_port is not None else None, s.insecure_network
        )
        self.plaintext_servers = exposed  # accepted with insecure_network: said at every start
        for server in exposed:
            log.warning("insecure_network: %s", server)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        upgrade(s.database_url)
        self.store = store = MetadataStore(s.database_url)
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        if not ray.is_initialized():
            if self.ray_address:
                ray.init(address=self.ray_address, log_to_driver=False)
            else:
                # Ray warns at every local start that it enabled token authentication, its
                # default for a local cluster and what robofleet wants: not news.
                logging.getLogger(RAY_AUTH_LOGGER).setLevel(logging.ERROR)
                ray.init(
                    num_cpus=self.num_cpus,
                    include_dashboard=False,
                    log_to_driver=False,
                    _node_ip_address="127.0.0.1",
                )
                self._started_ray = True
        self.sinks: dict[str, Any] = {}
        self.routes: dict[str, Any] = {}
        self.server = CloudServer(
            s.comms, store, sinks=self.sinks.get, port=self.grpc_port, routes=self.routes.get
        )
        port = self.server.start()
        address = f"{s.comms.bind_host}:{port}"
        if self.start_robots is not None:
            self.robots = self.start_robots(s, store, address)
        ctx = CloudContext(
            settings=s,
            store=store,
            server=self.server,
            server_address=address,
            sinks=self.sinks,
            python=sys.executable,
            routes=self.routes,
            eval_every_s=self.eval_every_s,
        )
        self.manager = RunManager(ctx, self.data_dir / "runs", auto_resume=self.auto_resume)
        if self.dashboard_port is not None:
            self._start_dashboard()
        self._write_pidfile(address)
        self.manager.resume_interrupted()
        self._spawn(self._liveness, "fleet-liveness")
        self._spawn(self._poll_runs, "run-requests")
        self._spawn(self._estop_sync, "estop-sync")
        self._spawn(self._metadata_retention, "metadata-retention")
        return self

    def _spawn(self, fn: Any, name: str) -> None:
        t = threading.Thread(target=fn, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _liveness(self) -> None:
        """Robots that stopped heartbeating are marked offline (hal.fleet.mark_offline)."""
        from hal.fleet import mark_offline

        assert self.store is not None
        hal = self.settings.hal
        while not self._stop.wait(hal.heartbeat_interval_s):
            try:
                marked = mark_offline(self.store, hal.offline_after_s)
                if marked:
                    log.warning(
                        "robots offline (no heartbeat for %ss): %s", hal.offline_after_s, marked
                    )
            except Exception as exc:
                log.warning("mark_offline failed: %s", exc)

    def _estop_sync(self) -> None:
        """E-stops and clears in the store reach the robots (runs.estop)."""
        from runs.estop import EstopSync

        assert self.store is not None and self.server is not None
        sync = EstopSync(self.store, self.server)
        while not self._stop.wait(0.5):
            try:
                sync.sync()
            except Exception:
                log.exception("e-stop sync failed")

    def _metadata_retention(self) -> None:
        """Keeps the append-only metadata tables bounded (foundation.store.retention)."""
        from foundation.store.retention import prune

        assert self.store is not None
        while not self._stop.wait(self.settings.metadata.every_s):
            try:
                prune(self.store, self.settings.metadata)
            except Exception:
                log.exception("metadata retention failed")

    def _poll_runs(self) -> None:
        assert self.manager is not None
        while not self._stop.wait(1.0):
            try:
                self.manager.poll()
            except Exception:
                log.exception("run manager poll failed")

    def _start_dashboard(self) -> None:
        import uvicorn

        from dashboard.accounts import ensure_bootstrap_admin
        from dashboard.app import create_app
        from dashboard.serve import uvicorn_config
        from runs.episode_view import RunEpisodes

        assert self.store is not None and self.dashboard_port is not None
        assert self.manager is not None
        self.admin_login = ensure_bootstrap_admin(self.store)
        app = create_app(
            self.settings,
            self.store,
            run_manager=self.manager,
            robot_control=self.server,
            episodes=RunEpisodes(self.server),
        )
        host = self.settings.dashboard.bind_host
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, self.dashboard_port))
        except OSError as err:
            sock.close()
            raise RuntimeError(
                f"cannot serve the dashboard on {host}:{self.dashboard_port}: {err} "
                "(choose another with --port, or --no-dashboard)"
            ) from None
        scheme = "https" if self.settings.dashboard.tls_cert_file is not None else "http"
        self.dashboard_url = f"{scheme}://{host}:{sock.getsockname()[1]}/"
        config = uvicorn_config(app, self.settings.dashboard, log_level="warning")
        self._uvicorn = uvicorn.Server(config)
        self._spawn(lambda: self._uvicorn.run(sockets=[sock]), "dashboard")

    def _write_pidfile(self, address: str) -> None:
        write_pidfile(self.data_dir, grpc=address, dashboard=self.dashboard_url)

    # -- stop ------------------------------------------------------------------------------

    def close(self, timeout_s: float = 120.0) -> None:
        """Let runs checkpoint and go (they resume at the next start), then stop everything."""
        import ray

        self._stop.set()
        if self.manager is not None:
            self.manager.shutdown(timeout_s)
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
        for t in self._threads:
            t.join(5)
        if self.robots is not None:
            self.robots.close()
        if self.server is not None:
            self.server.close()
        if self._started_ray:
            ray.shutdown()
        if self.store is not None:
            self.store.close()
        remove_pidfile(self.data_dir)
