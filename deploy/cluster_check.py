"""``python -m deploy.cluster_check --address HEAD:6379 --robot NAME ...``: is the cluster ready?

Joins the Ray cluster as a driver, lists the live nodes with the robots they offer
(``robot/<name>`` resources from ``robofleet hal node-command``), and places one tiny actor on
each named robot's node through that resource (:mod:`hal.resources`; runs need none of this:
the scheduler assigns robots over gRPC, Ray node or not). Prints one JSON object as the last
stdout line::

    {"nodes": [{"ip": "10.0.0.1", "robots": []}, ...], "placed": {"arm-7": "10.0.0.2"}}

Exit codes: 0 every robot placed on a node, 1 a robot offered by no node or not placed within
``--timeout`` seconds, 2 the cluster could not be reached.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

from hal.resources import PREFIX, robot_resource


class _Probe:
    def node_ip(self) -> str:
        import ray

        return str(ray.util.get_node_ip_address())


def node_robots(resources: dict[str, float]) -> list[str]:
    """The ``robot/...`` resource keys of one node, sorted, without the prefix."""
    return sorted(k.removeprefix(PREFIX) for k in resources if k.startswith(PREFIX))


def check(address: str, robots: Sequence[str], timeout_s: float) -> tuple[int, dict[str, Any]]:
    """(exit code, report) for the cluster at ``address``; see the module docstring."""
    import ray

    try:
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    except Exception as exc:  # ConnectionError, auth failures: all mean "not reachable"
        return 2, {"error": f"cannot join the Ray cluster at {address}: {exc}"}
    try:
        nodes = [
            {"ip": n["NodeManagerAddress"], "robots": node_robots(n["Resources"])}
            for n in ray.nodes()
            if n["Alive"]
        ]
        nodes.sort(key=lambda n: n["ip"])
        report: dict[str, Any] = {"nodes": nodes, "placed": {}}
        offered = {r for n in nodes for r in n["robots"]}
        missing = [r for r in robots if r not in offered]
        if missing:
            report["error"] = f"no node offers robot(s) {missing}"
            return 1, report
        probe: Any = ray.remote(num_cpus=0)(_Probe)
        actors: dict[str, Any] = {
            name: probe.options(resources={robot_resource(name): 0.001}).remote() for name in robots
        }
        try:
            ips = ray.get([a.node_ip.remote() for a in actors.values()], timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            report["error"] = f"robot actors not placed within {timeout_s}s"
            return 1, report
        report["placed"] = dict(zip(actors, ips, strict=True))
        for a in actors.values():
            ray.kill(a)
        return 0, report
    finally:
        ray.shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deploy.cluster_check", description=__doc__)
    p.add_argument("--address", required=True, help="Ray head host:port")
    p.add_argument("--robot", action="append", default=[], help="robot name to place (repeat)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for placement")
    args = p.parse_args(argv)
    code, report = check(args.address, args.robot, args.timeout)
    if "error" in report:
        print(f"cluster_check: {report['error']}", file=sys.stderr)
    print(json.dumps(report), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
