"""``robofleet hal``: probe this node's robots, list the fleet, print this node's ``ray start``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import socket
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from foundation.clitext import plain_text

if TYPE_CHECKING:
    from foundation.store.metadata_store import MetadataStore
    from hal.fleet import RobotReport
    from robofleet.settings import Settings


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="robofleet hal", description=plain_text(__doc__))
    p.add_argument("--config", default=None, help="YAML settings file")
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    pr = sub.add_parser("probe", help="list robots attached to this node, optionally report them")
    pr.add_argument("--report", action="store_true", help="store them in the metadata DB")
    pr.add_argument("--json", action="store_true", help="print JSON")
    sub.add_parser("list", help="robots in the metadata DB with status and last heartbeat")
    nc = sub.add_parser("node-command", help="print the `ray start` line with this node's robots")
    nc.add_argument("--address", default=None, help="head address host:port (omit for a head)")
    nc.add_argument("--num-cpus", type=int, default=None, help="the node's logical CPUs for Ray")
    return p


def main(argv: Sequence[str]) -> int:
    from robofleet.settings import load_settings

    args = _parser().parse_args(list(argv))
    settings = load_settings(args.config)
    return _ACTIONS[args.action](args, settings, Console())


def _probe(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    """``probe``: this node's robots as a table or JSON, stored in the metadata DB with
    ``--report``. Exit 2 when the hal settings are invalid."""
    from hal.fleet import report_robots

    reports = _probe_reports(settings)
    if reports is None:
        return 2
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in reports], indent=2))
    else:
        console.print(_probe_table(reports))
    if args.report:
        with _store(settings) as store:
            report_robots(store, reports, node=socket.gethostname(), node_ip=settings.hal.node_ip)
        console.print(f"reported {len(reports)} robot(s) to {settings.masked()['database_url']}")
    return 0


def _node_command(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    """``node-command``: the ``ray start`` line advertising this node's robots as resources.
    Exit 2 when the hal settings are invalid."""
    from hal.resources import node_resources, ray_start_command, shell_line

    reports = _probe_reports(settings)
    if reports is None:
        return 2
    res = node_resources((r.name, r.robot_type) for r in reports)
    command = ray_start_command(
        res, address=args.address, node_ip=settings.hal.node_ip, num_cpus=args.num_cpus
    )
    print(shell_line(command))
    return 0


def _list(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    """``list``: the robots in the metadata DB with status, node and last heartbeat."""
    from hal.fleet import list_robots

    with _store(settings) as store:
        robots = list_robots(store)
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


_ACTIONS: dict[str, Callable[[argparse.Namespace, Settings, Console], int]] = {
    "probe": _probe,
    "node-command": _node_command,
    "list": _list,
}


def _probe_reports(settings: Settings) -> list[RobotReport] | None:
    """The robots attached to this node; None (the error printed) when the hal settings are
    invalid."""
    from hal.discovery import probe

    try:
        return probe(settings.hal)
    except ValueError as exc:
        print(f"robofleet hal: {exc}", file=sys.stderr)
        return None


def _probe_table(reports: Sequence[RobotReport]) -> Table:
    table = Table("name", "type", "driver", "source", "hz", "obs", "action")
    for r in reports:
        obs = ", ".join(
            f"{k}{tuple(v['shape'])}" for k, v in r.spec["observation_features"].items()
        )
        act = tuple(r.spec["action_features"]["action"]["shape"])
        table.add_row(
            r.name, r.robot_type, r.driver, r.source, f"{r.spec['control_hz']:g}", obs, str(act)
        )
    return table


@contextmanager
def _store(settings: Settings) -> Iterator[MetadataStore]:
    """The metadata store at ``settings.database_url``, migrated to the newest schema first."""
    from foundation.store.metadata_store import MetadataStore, upgrade

    upgrade(settings.database_url)
    store = MetadataStore(settings.database_url)
    try:
        yield store
    finally:
        store.close()
