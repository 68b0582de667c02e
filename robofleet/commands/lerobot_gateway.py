"""``robofleet lerobot-gateway``: LeRobot's HIL-SERL actor joins a robofleet run unmodified.

Run one per robot computer, beside ``python -m lerobot.rl.actor`` and with the same LeRobot
training config (``edge_agent.lerobot_gateway``)::

    robofleet lerobot-gateway --server cloud:50051 --robot arm-1 --token T \\
        --lerobot-config train_config.json
    python -m lerobot.rl.actor --config_path train_config.json

The actor connects to ``policy.actor_learner_config.learner_host:learner_port`` of its config;
the gateway listens on ``127.0.0.1:<learner_port>`` unless ``--listen HOST:PORT`` names
another address. The first start enrolls with ``--token`` and keeps the credential in the
spool directory (mode 0600). A refused token or a bad config ends the command with one line on
stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from foundation.clitext import plain_text


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="robofleet lerobot-gateway", description=plain_text(__doc__))
    p.add_argument("--config", default=None, help="YAML settings file (edge:, comms: sections)")
    p.add_argument("--server", required=True, help="the cloud's gRPC host:port")
    p.add_argument("--robot", required=True, help="this robot's name in the fleet")
    p.add_argument("--token", default=None, help="one-time enrollment token (first start)")
    p.add_argument(
        "--lerobot-config",
        type=Path,
        required=True,
        help="LeRobot's training config JSON the actor runs with (its features and port)",
    )
    p.add_argument("--robot-type", default="lerobot-actor", help="robot_type in the fleet")
    p.add_argument(
        "--listen", default=None, help="HOST:PORT for the actor (default 127.0.0.1:learner_port)"
    )
    p.add_argument(
        "--parameters",
        default=None,
        metavar="MODULE:FUNCTION",
        help="version -> LeRobot parameter bytes (default: cloud_learner.lerobot_parameters."
        "parameter_bytes, for lerobot-sac runs)",
    )
    p.add_argument("--spool-dir", type=Path, default=None, help="overrides edge.spool_dir/<robot>")
    p.add_argument(
        "--drain-s", type=float, default=30.0, help="seconds a release waits for acknowledgements"
    )
    return p


def main(argv: Sequence[str]) -> int:
    from edge_agent.enrollment import EnrollmentRefused, EnrollmentStopped
    from edge_agent.lerobot_gateway.features import read_actor_config
    from edge_agent.lerobot_gateway.gateway import GatewayOptions, LeRobotGateway
    from edge_agent.lerobot_gateway.parameters import load_parameters_fn
    from hal.spec import validate_name
    from robofleet.settings import load_settings

    args = build_parser().parse_args(list(argv))
    settings = load_settings(args.config)
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(name)s %(message)s")
    try:
        validate_name(args.robot)
        opts = GatewayOptions(
            robot_name=args.robot,
            server=args.server,
            root=args.spool_dir or settings.edge.spool_dir / args.robot,
            actor=read_actor_config(args.lerobot_config, args.robot_type),
            token=args.token,
            listen=args.listen,
            parameters=load_parameters_fn(args.parameters),
            drain_s=args.drain_s,
        )
        gateway = LeRobotGateway(settings.edge, settings.comms, opts)

        def _stop(_sig: int, _frame: FrameType | None) -> None:
            gateway.stop()

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        port = gateway.start()
    except (ValueError, OSError, RuntimeError, EnrollmentRefused) as exc:
        print(f"robofleet lerobot-gateway: {exc}", file=sys.stderr)
        return 2
    except EnrollmentStopped:
        return 0
    print(f"robofleet lerobot-gateway: ready on port {port}", flush=True)
    gateway.run()
    return 0
