"""Robots as Ray custom resources, for robot computers that also join a Ray cluster.

Such a computer (``robofleet hal node-command`` prints its ``ray start`` line) offers each of
its robots as two resources: ``robot/<robot_type>`` (a count per type, so "any 4 sawyers" is
expressible) and ``robot/<name>`` (exactly 1), so Ray work that must run beside a robot
(``deploy.cluster_check``'s probe, an edge agent as a Ray actor) lands on that robot's node.
Runs do not need them: :mod:`hal.scheduler` leases robots in the metadata store, and every
robot computer, Ray node or not, is assigned to runs over its gRPC connection.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable

PREFIX = "robot/"


def type_resource(robot_type: str) -> str:
    return f"{PREFIX}{robot_type}"


def robot_resource(name: str) -> str:
    return f"{PREFIX}{name}"


def node_resources(robots: Iterable[tuple[str, str]]) -> dict[str, float]:
    """Ray resources of a node hosting ``(name, robot_type)`` robots.

    Raises:
        ValueError: a robot name appears twice.
    """
    res: dict[str, float] = {}
    for name, robot_type in robots:
        key = robot_resource(name)
        if key in res:
            raise ValueError(f"robot {name!r} declared twice on this node")
        res[key] = 1.0
        res[type_resource(robot_type)] = res.get(type_resource(robot_type), 0.0) + 1.0
    return res


def ray_start_command(
    resources: dict[str, float],
    *,
    address: str | None,
    node_ip: str | None = None,
    num_cpus: int | None = None,
    extra: Iterable[str] = (),
) -> list[str]:
    """argv of ``ray start`` joining ``address`` (or starting a head when None) with robots."""
    argv = ["ray", "start"]
    argv += [f"--address={address}"] if address else ["--head"]
    if node_ip:
        argv.append(f"--node-ip-address={node_ip}")
    if num_cpus is not None:
        argv.append(f"--num-cpus={num_cpus}")
    argv.append(f"--resources={json.dumps(resources, sort_keys=True)}")
    argv += list(extra)
    return argv


def shell_line(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)
