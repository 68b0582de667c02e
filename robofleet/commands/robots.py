"""``robofleet robots enroll NAME``: a one-time enrollment token for a robot computer, and the
exact ``robofleet edge`` command it runs with it.

The command takes no run id: the robot computer enrolls, goes idle and the cloud assigns it to
runs. ``--json`` prints ``{robot_name, robot_type, tags, token, expires_at, command}``.
Exit codes: 0 done, 2 an invalid option.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from datetime import timedelta

from comms.cloud.enrollment_tokens import DRIVER_PATTERN, KEY_PATTERN, issue_enrollment
from foundation.clitext import plain_text
from hal.drivers import KINDS_HELP, parse_options
from robofleet.commands.edge import OPERATORS, driver_options


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="robofleet robots", description=plain_text(__doc__.split("\n\n")[0])
    )
    p.add_argument("--config", default=None, help="YAML settings file")
    sub = p.add_subparsers(dest="action", required=True)
    e = sub.add_parser("enroll", help="create an enrollment token and print the edge command")
    e.add_argument("name", help="the robot's name (the token enrolls only this name)")
    e.add_argument(
        "--type", dest="robot_type", default=None, help="scheduling type (default: its driver's)"
    )
    e.add_argument(
        "--tag", action="append", default=[], metavar="KEY=VALUE", help="a tag run specs select by"
    )
    e.add_argument("--driver", default=None, help=f"its hal driver ({KINDS_HELP})")
    e.add_argument(
        "--driver-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a driver option, as `robofleet edge --driver-option` takes it",
    )
    e.add_argument("--operator", default=None, choices=OPERATORS, help="its operator device")
    e.add_argument(
        "--operator-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an operator option, as `robofleet edge --operator-option` takes it",
    )
    e.add_argument(
        "--server",
        default=None,
        metavar="HOST:PORT",
        help="cloud gRPC address (default: comms.cloud_address)",
    )
    e.add_argument(
        "--ttl-minutes",
        type=float,
        default=None,
        help="token lifetime (default: comms.enrollment_token_ttl_s)",
    )
    e.add_argument("--json", action="store_true", help="print JSON")
    return p


def tags_from(pairs: Sequence[str]) -> dict[str, str]:
    """``KEY=VALUE`` strings as tags (values stay strings).

    Raises:
        ValueError: an item without ``=`` or with a key that is not ``comms.cloud.enrollment_tokens.KEY_PATTERN``.
    """
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not re.match(KEY_PATTERN, key):
            raise ValueError(f"--tag {pair!r}: expected KEY=VALUE, KEY 1-64 of [A-Za-z0-9_.-]")
        out[key] = value
    return out


def main(argv: Sequence[str] = ()) -> int:
    from foundation.store.metadata_store import MetadataStore, upgrade
    from hal.spec import validate_name
    from robofleet.settings import load_settings

    args = build_parser().parse_args(list(argv))
    settings = load_settings(args.config)
    try:
        validate_name(args.name)
        if args.robot_type is not None:
            validate_name(args.robot_type, "robot type")
        if args.ttl_minutes is not None and not 0 < args.ttl_minutes <= 30 * 24 * 60:
            raise ValueError(f"--ttl-minutes {args.ttl_minutes:g}: between 0 and 30 days")
        tags, options = tags_from(args.tag), driver_options(args.driver_option)
        operator_options = parse_options(args.operator_option, "--operator-option")
        # Only the form: the lab's own driver is installed on its robot computer, not here.
        if args.driver is not None and not re.match(DRIVER_PATTERN, args.driver):
            raise ValueError(f"--driver {args.driver!r}: {KINDS_HELP}")
    except ValueError as exc:
        print(f"robofleet robots enroll: {exc}", file=sys.stderr)
        return 2
    ttl_s = (
        args.ttl_minutes * 60
        if args.ttl_minutes is not None
        else settings.comms.enrollment_token_ttl_s
    )
    upgrade(settings.database_url)
    store = MetadataStore(settings.database_url)
    try:
        issued = issue_enrollment(
            store,
            server=args.server or settings.comms.cloud_address,
            ttl=timedelta(seconds=ttl_s),
            robot_name=args.name,
            robot_type=args.robot_type,
            tags=tags,
            driver=args.driver,
            driver_options=options,
            operator=args.operator,
            operator_options=operator_options,
            actor="cli",
        )
    finally:
        store.close()
    if args.json:
        print(
            json.dumps(
                {
                    "robot_name": args.name,
                    "robot_type": args.robot_type,
                    "tags": tags,
                    "token": issued.token,
                    "expires_at": issued.expires_at.isoformat(),
                    "command": issued.command,
                }
            )
        )
    else:
        print(
            f"Run this on {args.name}'s computer (the token works once, until "
            f"{issued.expires_at.isoformat(timespec='seconds')}); it enrolls, goes idle and "
            "runs assign it:\n"
        )
        print(issued.command)
    return 0
