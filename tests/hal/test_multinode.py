"""Two Ray nodes in network namespaces joined by a veth pair (traffic never leaves them): the
scheduler places an edge agent on the robot's node and nowhere else."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from hal.resources import node_resources, ray_start_command
from tests.netns import netns_available, two_hosts

REPO = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))
pytestmark = pytest.mark.slow
# The suite pins Ray to one node (conftest); these processes are the deliberate exception.
_RAY_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1",
    "PYTHONPATH": str(REPO),
    # A token of this test's own cluster, so nothing reads or writes ~/.ray/auth_token.
    "RAY_AUTH_MODE": "token",
    "RAY_AUTH_TOKEN": uuid.uuid4().hex + uuid.uuid4().hex,
}


def _wait_for(log: Path, text: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text(errors="replace"):
            return
        assert proc.poll() is None, f"ray start exited: {log.read_text(errors='replace')[-3000:]}"
        time.sleep(0.5)
    raise AssertionError(f"{log.name}: no {text!r} within {timeout_s}s")


@pytest.fixture
def two_namespaces() -> Iterator[tuple[str, str, str, str]]:
    """(head namespace, robot namespace, head ip, robot ip); torn down even on failure."""
    with two_hosts("rfn", "10.213.77") as h:
        yield h.ns_a, h.ns_b, h.ip_a, h.ip_b


def _start(ns: str, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, **_RAY_ENV}
    with log.open("wb") as out:
        return subprocess.Popen(
            ["ip", "netns", "exec", ns, *argv],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@pytest.mark.skipif(not netns_available(), reason="needs root and iproute2 for namespaces")
@pytest.mark.timeout(240)
def test_edge_agent_lands_on_the_robots_node(
    two_namespaces: tuple[str, str, str, str], tmp_path: Path
) -> None:
    head_ns, robot_ns, head_ip, robot_ip = two_namespaces
    address = f"{head_ip}:6379"
    procs: list[subprocess.Popen[bytes]] = []
    # Short: Ray's AF_UNIX socket paths under it must stay below 108 bytes.
    ray_tmp = Path(f"/tmp/rf-{head_ns}")
    try:
        head = ray_start_command(
            {},
            address=None,
            node_ip=head_ip,
            num_cpus=1,
            extra=["--block", "--port=6379", "--include-dashboard=false", f"--temp-dir={ray_tmp}"],
        )
        head[0] = RAY
        procs.append(_start(head_ns, head, tmp_path / "head.log"))
        _wait_for(tmp_path / "head.log", "Ray runtime started", procs[0], 90)
        robot_node = ray_start_command(
            node_resources([("arm-7", "metaworld-sawyer")]),
            address=address,
            node_ip=robot_ip,
            num_cpus=1,
            extra=["--block"],
        )
        robot_node[0] = RAY
        procs.append(_start(robot_ns, robot_node, tmp_path / "robot.log"))
        _wait_for(tmp_path / "robot.log", "Ray runtime started", procs[1], 90)
        db = f"sqlite:///{tmp_path}/meta.db"
        out = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                head_ns,
                sys.executable,
                "-m",
                "tests.hal.multinode_driver",
                address,
                db,
                "arm-7",
                robot_ip,
            ],
            cwd=REPO,
            env={**os.environ, **_RAY_ENV},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, (
            out.stderr[-3000:] + (tmp_path / "robot.log").read_text()[-2000:]
        )
        result = json.loads(out.stdout.strip().splitlines()[-1])
        assert result["nodes"] == [head_ip, robot_ip]  # both nodes joined, over the veth only
        assert result["edge_agents_on"] == [robot_ip] * 2
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=30)
        shutil.rmtree(ray_tmp, ignore_errors=True)
