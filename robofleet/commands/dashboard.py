"""``robofleet dashboard``: migrate the metadata store, create the first admin, serve HTTP."""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
from collections.abc import Sequence

from foundation.clitext import plain_text
from robofleet.settings import load_settings


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="robofleet dashboard", description=plain_text(__doc__))
    p.add_argument("--config", default=None, help="YAML settings file")
    p.add_argument("--host", default=None, help="bind address (default: dashboard.bind_host)")
    p.add_argument("--port", type=int, default=None, help="port (default: dashboard.port; 0 = any)")
    return p


def main(argv: Sequence[str]) -> int:
    # `robofleet dashboard -- --port 0` passes the separator through; no option takes "--".
    args = build_parser().parse_args([a for a in argv if a != "--"])
    settings = load_settings(args.config)
    host = args.host or settings.dashboard.bind_host
    port = settings.dashboard.port if args.port is None else args.port
    settings.dashboard = settings.dashboard.model_copy(update={"bind_host": host, "port": port})

    from dashboard.exposure import InsecureNetworkError, check_exposure

    try:
        # The standalone dashboard serves HTTP only; gRPC is the cloud's to check.
        exposed = check_exposure(
            settings.comms.model_copy(update={"bind_host": "127.0.0.1"}),
            settings.dashboard,
            settings.insecure_network,
        )
    except InsecureNetworkError as exc:
        print(f"robofleet dashboard: {exc}", file=sys.stderr)
        return 2
    for server in exposed:
        print(f"robofleet dashboard: insecure_network: {server}", file=sys.stderr, flush=True)

    import uvicorn

    from dashboard.accounts import ensure_bootstrap_admin
    from dashboard.app import create_app
    from dashboard.serve import uvicorn_config
    from foundation.store.metadata_store import MetadataStore, upgrade
    from runs.episode_view import RunEpisodes
    from runs.manager import QueuedRunManager

    upgrade(settings.database_url)
    store = MetadataStore(settings.database_url)
    created = ensure_bootstrap_admin(store)
    if created is not None:
        user, password = created
        print(
            "robofleet dashboard: created the first admin account (shown once, change it"
            f" under Account):\n  username: {user}\n  password: {password}",
            flush=True,
        )
    app = create_app(
        settings,
        store,
        run_manager=QueuedRunManager(store, settings.data_dir),
        episodes=RunEpisodes(),  # reads runs' buffer directories read-only
    )
    # Bind first so that port 0 works and the printed address is the real one.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        print(f"robofleet dashboard: cannot bind {host}:{port}: {err}", file=sys.stderr)
        return 1
    config = uvicorn_config(
        app, settings.dashboard, log_level=settings.log_level.lower(), timeout_graceful_shutdown=2
    )
    http = uvicorn.Server(config)
    # uvicorn shuts down gracefully on SIGTERM/SIGINT, then restores the handlers it found and
    # raises the signal again: with Python's defaults that kills the process (-15) or raises
    # KeyboardInterrupt. These handlers make that second delivery a no-op, so a stop exits 0.
    # Installed before the address is printed: a stop may come as soon as it is.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: setattr(http, "should_exit", True))
    # Listen before printing the address: a client that connects as soon as it reads the line
    # waits in the backlog until uvicorn accepts, instead of being refused.
    sock.listen(config.backlog)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    scheme = "https" if settings.dashboard.tls_cert_file is not None else "http"
    print(f"robofleet dashboard: serving on {scheme}://{shown}:{bound}/", flush=True)
    logging.getLogger("uvicorn.error").propagate = False
    try:
        http.run(sockets=[sock])
    finally:
        store.close()
    print("robofleet dashboard: stopped", flush=True)
    return 0
