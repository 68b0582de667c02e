"""``robofleet hal``: probe this node's robots, list the fleet, print this node's ``ray start``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import socket
import sys
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="robofleet hal", description=__doc__)
    p.add_argument("--config", default=None, help="YAML settings file")
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    pr = sub.add_parser("probe", help="list robots attached to this node, optionally report them")
    pr.add_argument("--report", action="store_true", help="store them in the metadata DB")
    pr.add_argument("--json", action="store_true", help="print JSON")
    sub.add_parser("list", help="robots in the metadata DB with status and last heartbeat")
    nc = sub.add_parser("node-command", help="print the `ray start` line with this node's robots")
    nc.add_argument("--address", default=None, help="head address host:port (omit for a head)")
    nc.add_argument("--num-cpus", type=int, default=None)
    return p


def main(argv: Sequence[str]) -> int:
    from hal.discovery import probe
    from hal.fleet import list_robots, report_robots
    from hal.resources import node_resources, ray_start_command, shell_line
    from robofleet.app.settings import load_settings
    from robofleet.store.store import MetadataStore, upgrade

    args = _parser().parse_args(list(argv))
    settings = load_settings(args.config)
    hal = settings.hal
    console = Console()
    if args.action in ("probe", "node-command"):
        try:
            reports = probe(hal)
        except ValueError as exc:
            print(f"robofleet hal: {exc}", file=sys.stderr)
            return 2
        if args.action == "node-command":
            res = node_resources((r.name, r.robot_type) for r in reports)
            print(
                shell_line(
                    ray_start_command(
                        res, address=args.address, node_ip=hal.node_ip, num_cpus=args.num_cpus
                    )
                )
            )
            return 0
        if args.json:
            print(json.dumps([dataclasses.asdict(r) for r in reports], indent=2))
        else:
            table = Table("name", "type", "driver", "source", "hz", "obs", "action")
            for r in reports:
                obs = ", ".join(
                    f"{k}{tuple(v['shape'])}" for k, v in r.spec["observation_features"].items()
                )
                act = tuple(r.spec["action_features"]["action"]["shape"])
                table.add_row(
                    r.name,
                    r.robot_type,
                    r.driver,
                    r.source,
                    f"{r.spec['control_hz']:g}",
                    obs,
                    str(act),
                )
            console.print(table)
        if args.report:
            upgrade(settings.database_url)
            store = MetadataStore(settings.database_url)
            try:
                report_robots(store, reports, node=socket.gethostname(), node_ip=hal.node_ip)
            finally:
                store.close()
            console.print(
                f"reported {len(reports)} robot(s) to {settings.masked()['database_url']}"
            )
        return 0
    # list
    upgrade(settings.database_url)
    store = MetadataStore(settings.database_url)
    try:
        robots = list_robots(store)
    finally:
        store.close()
    table = Table("name", "type", "status", "node", "last heartbeat")
    for robot in robots:
        seen = (
            robot.last_heartbeat_at.isoformat(timespec="seconds")
            if robot.last_heartbeat_at
            else "-"
        )
        table.add_row(
            robot.name, robot.robot_type, str(robot.status), str(robot.tags.get("node", "-")), seen
        )
    console.print(table)
    return 0
