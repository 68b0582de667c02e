"""``robofleet edge``: run one robot's edge agent (no Ray needed).

Example (a robot computer: enrolls, goes idle, the cloud assigns it to runs)::

    robofleet edge --config edge.yaml --server cloud:50051 --token T --robot sawyer-1 \\
        --operator scripted
    robofleet edge --server cloud:50051 --robot arm-1 --operator gamepad \\
        --driver lerobot --driver-option type=so101_follower \\
        --driver-option 'config={"port": "/dev/ttyACM0"}'
    robofleet edge --server cloud:50051 --robot arm-1 --driver lerobot \
        --driver-option type=so101_follower --driver-option 'config={"port": "/dev/ttyACM0"}' \
        --operator lerobot --operator-option type=so101_leader \
        --operator-option port=/dev/ttyACM1 --operator-option id=leader-1

``--operator lerobot`` runs any LeRobot teleoperator as the robot's operator
(``edge_agent.teleop``): ``type`` names it (``so101_leader``, ``koch_leader``,
``openarm_mini``, ``gamepad``, ``keyboard_ee``, ``phone``, ...), other options fill its
LeRobot config's fields; ``takeover_key`` (default space) or ``takeover_pedal`` with
``pedal_device`` toggles takeover; ``action_map`` renames its action keys onto the robot's;
an actuated leader is driven to the follower's pose before the person takes over.
``--operator spacemouse`` reads a 3Dconnexion SpaceMouse (hidapi) as end-effector deltas
(``edge_agent.spacemouse``): ``path`` / ``vendor`` / ``product`` pick the device,
``translation_scale``, ``rotation_scale`` and ``deadzone`` shape its motion; its left button
toggles takeover, its right one the gripper.

Without ``--run`` the robot computer waits for the cloud to assign it (``edge_agent.host``):
the run's tasks, episode length, control rate and weight rules come with the assignment, and
after a run it goes idle for the next one. ``--run ID`` instead streams to one fixed run (or,
without ``--server``, records offline into the spool) with ``--task``/``--max-steps`` from the
command line.

``--driver`` picks the robot's ``hal`` driver (Meta-World by default; gymnasium, lerobot and
ros2 need only the ``edge`` extra, plus ``ros`` for ros2), or a lab's own ``RobotDriver``
subclass: ``--driver my_pkg.arms:MyArm`` or the name of a ``robofleet.drivers`` entry point
(``hal.drivers``). A driver that cannot be loaded ends the command with one line naming it
and exit code 2.

The first start enrolls with ``--token`` and keeps the credential in the spool directory
(mode 0600); later starts reuse it. An unreachable cloud is waited for (a unit that boots
before its cloud or network); a refused token ends the command with one line on stderr and
exit code 2. ``--report`` prints the control-loop statistics as one JSON object on the last
stdout line.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from foundation.clitext import plain_text
from hal.drivers import KINDS_HELP, driver_class, parse_options

if TYPE_CHECKING:
    from edge_agent.build import AgentOptions

# The operator devices a robot computer can run with (edge_agent.operators.make_operator).
OPERATORS = ("none", "scripted", "keyboard", "gamepad", "remote", "lerobot", "spacemouse")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="robofleet edge", description=plain_text(__doc__.splitlines()[0])
    )
    p.add_argument("--config", default=None, help="YAML settings file (edge:, comms: sections)")
    p.add_argument("--server", default=None, help="cloud gRPC host:port (omit to run offline)")
    p.add_argument("--token", default=None, help="one-time enrollment token (first start only)")
    p.add_argument(
        "--relay",
        default=None,
        metavar="HOST:PORT",
        help="the site relay's gRPC (edge.relay): weights from it, uploads through it",
    )
    p.add_argument("--robot", default="edge-robot", help="robot name")
    p.add_argument(
        "--task",
        action="append",
        default=None,
        help="task name (repeat for several; default: the driver's own, or the run's)",
    )
    p.add_argument(
        "--run",
        default=None,
        help="stream to this one run (default: wait for the cloud to assign runs)",
    )
    p.add_argument(
        "--operator",
        default="scripted",
        choices=OPERATORS,
        help="who may take over: scripted expert, keyboard, gamepad, remote (a person at the "
        "dashboard's operator station), lerobot (a LeRobot teleoperator, see "
        "--operator-option), spacemouse (end-effector deltas) or none",
    )
    p.add_argument(
        "--operator-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a lerobot operator option, VALUE as JSON if it parses: type=so101_leader|"
        "koch_leader|gamepad|keyboard_ee|phone|..., the LeRobot config's fields (port=..., "
        "id=..., use_gripper=false), takeover_key=space|none, takeover_pedal=KEY_A with "
        'pedal_device=/dev/input/..., action_map=\'{"delta_x": "dx"}\', handover_s=2.0; '
        "a spacemouse option: path=/dev/hidrawN, vendor=0x256f, product=0xc635, "
        "translation_scale=1.0, rotation_scale=1.0, deadzone=0.1, gripper_mode=toggle|hold",
    )
    p.add_argument("--episodes", type=int, default=None, help="stop after N episodes")
    p.add_argument("--max-steps", type=int, default=500, help="episode length")
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="episode seed of the first episode (then +1 each); differ per robot for other goals",
    )
    p.add_argument(
        "--driver",
        default="metaworld",
        help=f"the robot's hal driver ({KINDS_HELP}; default: a simulated Meta-World Sawyer)",
    )
    p.add_argument(
        "--driver-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a driver option, VALUE as JSON if it parses (e.g. env_id=Pendulum-v1, "
        'type=so101_follower, config=\'{"port": "/dev/ttyACM0"}\', joints=\'["j1","j2"]\')',
    )
    p.add_argument("--spool-dir", type=Path, default=None, help="overrides edge.spool_dir/<robot>")
    p.add_argument("--report", action="store_true", help="print loop statistics as JSON at exit")
    return p


def driver_options(pairs: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings as driver options (``hal.drivers.parse_options``): a VALUE that
    parses as JSON is taken as JSON (numbers, lists, objects), any other as a string.

    Raises:
        ValueError: an item without ``=`` or with an empty key, named.
    """
    return parse_options(pairs, "--driver-option")


def check_server(target: str) -> None:
    """Refuse a ``--server`` that names no port: a bare host would be dialled on gRPC's
    default port 443 and waited for forever, as an unreachable cloud is. A target with a
    gRPC scheme (``dns:``, ``unix:``, ``ipv4:``, ``ipv6:``) is left to gRPC.

    Raises:
        ValueError: ``target`` is not ``host:port`` (IPv6 in brackets).
    """
    from comms.robot.dataplane_client import is_host_port

    if target.startswith(("dns:", "unix:", "ipv4:", "ipv6:")):
        return
    if not is_host_port(target):
        raise ValueError(
            f"--server must be the cloud's gRPC host:port (e.g. cloud.lan:50051), got {target!r}"
        )


def options_from_args(args: argparse.Namespace) -> AgentOptions:
    """The agent options a parsed ``robofleet edge`` command line asks for.

    Raises:
        ValueError: a ``--server`` that is not host:port, a bad ``--driver-option`` or
            ``--operator-option``, an
            ``--operator-option`` without ``--operator lerobot`` or ``spacemouse``, or a ``--driver`` that is unknown or cannot be
            loaded (``hal.drivers.driver_class``, named).
    """
    from edge_agent.build import AgentOptions

    if args.server is not None:
        check_server(args.server)
    driver_class(args.driver)
    if args.operator_option and args.operator not in ("lerobot", "spacemouse"):
        raise ValueError(
            f"--operator-option is for --operator lerobot or spacemouse, not {args.operator}"
        )

    # A robot computer takes its tasks from each run; a fixed run without --task runs the
    # driver's own (edge_agent.build).
    return AgentOptions(
        robot_name=args.robot,
        tasks=args.task or [],
        driver=args.driver,
        driver_options=driver_options(args.driver_option),
        operator_options=parse_options(args.operator_option, "--operator-option"),
        run_id=args.run or "offline",
        server=args.server,
        token=args.token,
        operator=args.operator,
        max_episode_steps=args.max_steps,
        spool_dir=args.spool_dir,
        seed=args.seed,
    )


def main(argv: Sequence[str]) -> int:
    from robofleet.settings import load_settings

    args = build_parser().parse_args(list(argv))
    settings = load_settings(args.config)
    if args.relay:
        from pydantic import ValidationError

        try:
            edge = type(settings.edge).model_validate(
                {**settings.edge.model_dump(), "relay": args.relay}
            )
        except ValidationError as exc:
            print(f"robofleet edge: --relay: {exc.errors()[0]['msg']}", file=sys.stderr)
            return 2
        settings = settings.model_copy(update={"edge": edge})
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(name)s %(message)s")
    try:
        opts = options_from_args(args)
    except ValueError as exc:
        print(f"robofleet edge: {exc}", file=sys.stderr)
        return 2
    if args.run is None and args.server is not None:
        return _serve(settings, opts, args)
    from edge_agent.build import build_agent
    from edge_agent.enrollment import EnrollmentRefused

    try:
        built = build_agent(settings.edge, settings.comms, opts)
    except (ValueError, EnrollmentRefused) as exc:
        print(f"robofleet edge: {exc}", file=sys.stderr)
        return 2

    def _stop(_sig: int, _frame: FrameType | None) -> None:
        built.agent.stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        built.agent.run(episodes=args.episodes)
        if args.server:  # give the cloud a moment to take what is spooled; the rest waits
            built.agent.uplink.wait_acked(10.0)
        report = built.agent.report()
    finally:
        built.close()
    if args.report:
        print(json.dumps(report))
    return 0


def _serve(settings: Any, opts: AgentOptions, args: argparse.Namespace) -> int:
    """A robot computer: idle until the cloud assigns it (``edge_agent.host``)."""
    from edge_agent.enrollment import EnrollmentRefused
    from edge_agent.host import RobotComputer

    try:
        computer = RobotComputer(settings.edge, settings.comms, opts)
    except ValueError as exc:
        print(f"robofleet edge: {exc}", file=sys.stderr)
        return 2

    def _stop(_sig: int, _frame: FrameType | None) -> None:
        computer.stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        report = computer.run()
    except (ValueError, EnrollmentRefused) as exc:
        print(f"robofleet edge: {exc}", file=sys.stderr)
        return 2
    if args.report:
        print(json.dumps(report))
    return 0
