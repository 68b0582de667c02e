"""``robofleet cloud``: the cloud side (gRPC services, buffers, learners, run manager, API).

Runs until SIGINT/SIGTERM; then every run checkpoints and lets go of its robots, and the next
``robofleet cloud`` resumes the runs that were running (``orchestration.auto_resume: false``
or ``--no-auto-resume`` marks them crashed instead, for a one-click resume). A cloud that is
killed outright leaves its runs ``running`` in the metadata store; they resume the same way.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from foundation.clitext import plain_text


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="robofleet cloud", description=plain_text(__doc__.split("\n\n")[0])
    )
    p.add_argument("--config", default=None, help="YAML settings file")
    p.add_argument("--ray-address", default=None, help="join this Ray cluster (default: local)")
    p.add_argument("--num-cpus", type=int, default=None, help="logical CPUs of the local Ray")
    p.add_argument("--sim-robots", type=int, default=0, help="enroll N simulated robots")
    p.add_argument(
        "--sim-cameras",
        default="",
        help="comma-separated Meta-World cameras the simulated robots render (e.g. corner)",
    )
    p.add_argument(
        "--sim-image-size", type=int, default=64, help="side of their square frames (pixels)"
    )
    p.add_argument("--port", type=int, default=None, help="dashboard port (default: settings)")
    p.add_argument("--grpc-port", type=int, default=None, help="comms port (default: settings)")
    p.add_argument("--no-dashboard", action="store_true", help="do not serve the web dashboard")
    p.add_argument(
        "--no-auto-resume",
        action="store_true",
        help="mark runs left running as crashed (default: orchestration.auto_resume)",
    )
    p.add_argument(
        "--eval-every",
        type=float,
        default=None,
        metavar="SECONDS",
        help="evaluation cadence of every run (default: its spec's evaluation.every_seconds)",
    )
    return p


def auto_resume(settings: Any, args: argparse.Namespace) -> bool:
    """Whether this start resumes runs left running: the setting, unless the flag says no."""
    return bool(settings.orchestration.auto_resume) and not args.no_auto_resume


def stop_on_signals(done: threading.Event) -> None:
    """SIGTERM and SIGINT set ``done`` (the main thread then shuts the cloud down)."""
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())


def main(argv: Sequence[str] = ()) -> int:
    args = build_parser().parse_args(list(argv))
    from dashboard.exposure import InsecureNetworkError
    from robofleet.cloud import CloudService
    from robofleet.settings import load_settings
    from robofleet.sim.computers import sim_robots

    settings = load_settings(args.config)
    cameras = [c for c in args.sim_cameras.split(",") if c]
    size = (args.sim_image_size, args.sim_image_size)
    cloud = CloudService(
        settings,
        ray_address=args.ray_address,
        num_cpus=args.num_cpus,
        robots=sim_robots(args.sim_robots, cameras, size) if args.sim_robots else None,
        dashboard_port=None
        if args.no_dashboard
        else (settings.dashboard.port if args.port is None else args.port),
        grpc_port=args.grpc_port,
        auto_resume=auto_resume(settings, args),
        eval_every_s=args.eval_every,
    )
    done = threading.Event()
    stop_on_signals(done)
    try:
        cloud.start()
    except InsecureNetworkError as exc:
        print(f"robofleet cloud: {exc}", file=sys.stderr, flush=True)
        return 2
    stop_on_signals(done)
    assert cloud.manager is not None
    print(f"robofleet cloud: gRPC on {cloud.manager.ctx.server_address}", flush=True)
    if cloud.dashboard_url:
        print(f"robofleet cloud: dashboard on {cloud.dashboard_url}", flush=True)
        if cloud.admin_login:
            print(f"  login: {cloud.admin_login[0]} / {cloud.admin_login[1]}", flush=True)
    for server in cloud.plaintext_servers:
        print(f"robofleet cloud: insecure_network: {server}", flush=True)
    print("robofleet cloud: ready", flush=True)
    try:
        done.wait()
    finally:
        print("robofleet cloud: shutting down (runs will resume at the next start)", flush=True)
        cloud.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
