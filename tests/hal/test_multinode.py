"""A robot computer on its own network, never a Ray node, is assigned to a run.

Two hosts in network namespaces joined by a veth pair (traffic never leaves them): the cloud
(``robofleet cloud``: its Ray on its own loopback, gRPC bound on its veth address) on one; on
the other a robot computer (``robofleet edge`` with no ``--run``): no Ray, nothing listening,
only its outbound gRPC connection to the cloud. A run asking for one Meta-World Sawyer gets it,
its steps land in the run's buffer, and when the run stops the robot goes back to idle.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from edge_agent.host import run_spool
from foundation.store.metadata_store import MetadataStore
from foundation.store.models import Robot, RobotStatus, RunState
from runs.accounting import acked_total
from tests.fakes.cloud import ROBOFLEET, RobofleetCloud, cli, store_for
from tests.fakes.procs import Child, descendants
from tests.fakes.settings import cloud_env
from tests.netns import TwoHosts, netns_available, two_hosts
from tests.runs.helpers import (
    active_lease_robots,
    progress,
    run_state,
    spec_file,
    wait_until,
)

pytestmark = pytest.mark.slow

ROBOT = "arm-7"
SITE = {"site": "behind-its-own-router"}  # what the run selects: this robot only


@pytest.fixture
def hosts() -> Iterator[TwoHosts]:
    """The cloud's host (a) and the robot computer's (b); torn down even on failure."""
    with two_hosts("rfn", "10.213.77") as h:
        yield h


def _robot(store: MetadataStore) -> Robot | None:
    with store.session() as s:
        return s.scalar(select(Robot).where(Robot.name == ROBOT))


def _heartbeat(store: MetadataStore) -> dict[str, Any]:
    robot = _robot(store)
    return dict(robot.stats or {}) if robot is not None else {}


def _in_namespace(ns: str, *argv: str) -> str:
    return subprocess.run(
        ["ip", "netns", "exec", ns, *argv], check=True, capture_output=True, text=True
    ).stdout


def _namespace_processes(ns: str) -> dict[int, list[str]]:
    """pid -> argv of every process in network namespace ``ns``."""
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=True)
    procs = {}
    for pid in out.stdout.split():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        except FileNotFoundError:
            continue  # ended meanwhile
        procs[int(pid)] = argv
    return procs


def _is_ray(argv: list[str]) -> bool:
    """A Ray process: its raylet or GCS, or a worker (Ray titles those ``ray::...``)."""
    return Path(argv[0]).name in ("raylet", "gcs_server") or argv[0].startswith("ray::")


def _launch(data_dir: Path, spec: Path) -> str:
    out = cli(data_dir, "run", "launch", str(spec), "--json")
    assert out.returncode == 0, out.stderr
    return str(json.loads(out.stdout.strip().splitlines()[-1])["run_id"])


@pytest.mark.skipif(not netns_available(), reason="needs root and iproute2 for namespaces")
@pytest.mark.timeout(360)
def test_robot_computer_on_its_own_network_never_a_ray_node_is_assigned_to_a_run(
    hosts: TwoHosts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_dir, robot_dir = tmp_path / "cloud", tmp_path / "robot"
    # A private veth pair between two namespaces: plaintext gRPC is accepted explicitly.
    monkeypatch.setenv("ROBOFLEET_INSECURE_NETWORK", "true")
    cloud = RobofleetCloud(
        data_dir, sim_robots=0, netns=hosts.ns_a, comms={"bind_host": hosts.ip_a}
    )
    robot: Child | None = None
    try:
        server = cloud.grpc_address
        assert server.startswith(f"{hosts.ip_a}:")
        assert f"insecure_network: gRPC on {hosts.ip_a}" in cloud.fail_text()
        store = store_for(data_dir)
        token = store.create_enrollment_token(timedelta(minutes=10), tags=SITE)
        robot_dir.mkdir()
        robot = Child(
            [
                *("ip", "netns", "exec", hosts.ns_b, *ROBOFLEET, "edge"),
                *("--server", server, f"--token={token}", "--robot", ROBOT),
                *("--driver", "metaworld", "--operator", "scripted"),
                *("--spool-dir", str(robot_dir / "spool")),
            ],
            log=robot_dir / "edge.log",
            lines=False,
            env=cloud_env(robot_dir),  # the robot computer's own data dir and settings
        )

        def logs() -> str:
            return f"robot:\n{robot.output() if robot else ''}\ncloud:\n{cloud.fail_text()}"

        # Enrolled over gRPC and idle: schedulable, though no Ray node knows it.
        wait_until(lambda: _heartbeat(store).get("state") == "idle", 120, logs)
        enrolled = _robot(store)
        assert enrolled is not None and enrolled.status == RobotStatus.IDLE
        assert enrolled.robot_type == "metaworld-sawyer" and "node_ip" not in enrolled.tags
        # Not a Ray node, outbound only: nothing of Ray runs on its host, nothing listens there.
        on_robot_host = _namespace_processes(hosts.ns_b)
        assert set(on_robot_host) <= {robot.pid, *descendants(robot.pid)}, on_robot_host
        assert not any(_is_ray(argv) for argv in on_robot_host.values()), on_robot_host
        assert _in_namespace(hosts.ns_b, "ss", "-Hltun").strip() == ""

        spec = spec_file(tmp_path / "spec.yaml", "own-network", 1, tags=SITE)
        run_id = _launch(data_dir, spec)
        wait_until(
            lambda: (
                _heartbeat(store).get("run_id") == run_id
                and _heartbeat(store).get("state") == "running"
            ),
            150,
            logs,
        )
        assert active_lease_robots(store, run_id) == {enrolled.id}
        wait_until(lambda: run_state(store, run_id) == RunState.RUNNING, 120, logs)
        # Its steps land in the run's buffer.
        wait_until(lambda: progress(store, run_id).get("env_steps", 0) > 30, 120, logs)
        steps = progress(store, run_id)["env_steps"]
        wait_until(lambda: progress(store, run_id)["env_steps"] > steps + 30, 90, logs)

        out = cli(data_dir, "run", "stop", run_id)
        assert out.returncode == 0, out.stderr
        wait_until(lambda: run_state(store, run_id) == RunState.STOPPED, 120, logs)
        wait_until(lambda: _heartbeat(store).get("state") == "idle", 60, logs)
        released = _robot(store)
        assert released is not None and released.status == RobotStatus.IDLE
        assert active_lease_robots(store, run_id) == set()
        assert acked_total([run_spool(robot_dir / "spool", run_id)]) > steps
    finally:
        if robot is not None:
            robot.stop(60)
        cloud.stop()
