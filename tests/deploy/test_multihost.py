"""The guide's multi-node Ray commands, run verbatim: a head (GPU server) and a robot computer
as two hosts in network namespaces joined by a veth pair (traffic never leaves them).

The commands come from the code blocks of docs/deploy.md marked ``<!-- deploy-test: NAME -->``,
so the guide and this test cannot drift apart. Checks: the robot node runs exactly the line
``robofleet hal node-command`` printed, ``robofleet cloud --ray-address`` joins the cluster
from the head, and an actor needing the robot's resource lands on the robot's node.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.netns import netns_available, two_hosts

from ._paths import GUIDE, REPO

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent
SUBNET = "10.215.99"


def guide_blocks() -> dict[str, str]:
    """{name: code} of the guide's blocks marked for this test."""
    pattern = re.compile(r"<!-- deploy-test: (\S+) -->\n```\w*\n(.*?)```", re.S)
    return dict(pattern.findall(GUIDE.read_text()))


def test_guide_marks_the_blocks_this_test_runs() -> None:
    blocks = guide_blocks()
    assert set(blocks) == {"ray-head", "robot.yaml", "ray-robot", "cloud", "check"}
    assert "robofleet hal --config robot.yaml node-command" in blocks["ray-robot"]
    assert "robofleet cloud --ray-address" in blocks["cloud"]


@pytest.fixture
def hosts() -> Iterator[tuple[str, str, str, str]]:
    """(head namespace, robot namespace, head ip, robot ip); torn down even on failure."""
    with two_hosts("rfd", SUBNET) as h:
        yield h.ns_a, h.ns_b, h.ip_a, h.ip_b


class Host:
    """Runs guide blocks with bash inside one namespace, with the guide's variables set."""

    def __init__(self, ns: str, env: dict[str, str], cwd: Path) -> None:
        self.ns, self.env, self.cwd = ns, env, cwd

    def argv(self, code: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns, "bash", "-euc", code]

    def run(self, code: str, timeout_s: float) -> str:
        out = subprocess.run(
            self.argv(code),
            env=self.env,
            cwd=self.cwd,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        assert out.returncode == 0, f"[{self.ns}] {code}\n{out.stdout[-2000:]}{out.stderr[-3000:]}"
        return out.stdout

    def start(self, code: str, log: Path) -> subprocess.Popen[bytes]:
        with log.open("wb") as f:
            return subprocess.Popen(
                self.argv(code),
                env=self.env,
                cwd=self.cwd,
                stdout=f,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )


def _wait_for(log: Path, text: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace"):
            return
        assert proc.poll() is None, f"exited {proc.returncode}: {log.read_text()[-3000:]}"
        time.sleep(0.5)
    raise AssertionError(f"no {text!r} within {timeout_s}s: {log.read_text()[-3000:]}")


@pytest.mark.skipif(not netns_available(), reason="needs root and iproute2")
@pytest.mark.timeout(240)
def test_guide_commands_build_a_two_host_ray_cluster(
    hosts: tuple[str, str, str, str], tmp_path: Path
) -> None:
    head_ns, robot_ns, head_ip, robot_ip = hosts
    blocks = guide_blocks()
    ray_tmp = Path(f"/tmp/rf-{head_ns}")  # short: AF_UNIX paths under it stay below 108 bytes
    env = {
        **os.environ,
        "PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "PYTHONPATH": str(REPO),
        "RAY_USAGE_STATS_ENABLED": "0",
        # The suite pins Ray to one node (conftest); this cluster is the deliberate exception.
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": uuid.uuid4().hex + uuid.uuid4().hex,
        "HEAD_IP": head_ip,
        "ROBOT_IP": robot_ip,
        "RAY_TMP": str(ray_tmp),
        "ROBOFLEET_DATA_DIR": str(tmp_path / "cloud-data"),
    }
    head_dir, robot_dir = tmp_path / "head", tmp_path / "robot"
    head_dir.mkdir()
    robot_dir.mkdir()
    head, robot = Host(head_ns, env, head_dir), Host(robot_ns, env, robot_dir)
    cloud: subprocess.Popen[bytes] | None = None
    try:
        head.run(blocks["ray-head"], timeout_s=90)
        (robot_dir / "robot.yaml").write_text(blocks["robot.yaml"])
        printed = robot.run(blocks["ray-robot"], timeout_s=120)
        # The robot node ran exactly the line node-command printed, with its robot resources.
        line = (robot_dir / "ray-node.sh").read_text().strip()
        assert printed.splitlines()[0] == line
        assert line.startswith(f"ray start --address={head_ip}:6379 --node-ip-address={robot_ip}")
        assert "robot/arm-7" in line and "robot/metaworld-sawyer" in line

        log = tmp_path / "cloud.log"
        cloud = head.start(blocks["cloud"], log)
        _wait_for(log, "robofleet cloud: ready", cloud, 120)

        report = json.loads(head.run(blocks["check"], timeout_s=90).strip().splitlines()[-1])
        nodes = {n["ip"]: n["robots"] for n in report["nodes"]}
        assert set(nodes) == {head_ip, robot_ip}  # both hosts joined, over the veth only
        assert nodes[head_ip] == []
        assert nodes[robot_ip] == ["arm-7", "metaworld-sawyer"]
        assert report["placed"] == {"arm-7": robot_ip}
        assert cloud.poll() is None, "the cloud exited while joined to the cluster"
    finally:
        if cloud is not None and cloud.poll() is None:
            os.killpg(cloud.pid, signal.SIGTERM)
            try:
                cloud.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(cloud.pid, signal.SIGKILL)
                cloud.wait(timeout=10)
        shutil.rmtree(ray_tmp, ignore_errors=True)
