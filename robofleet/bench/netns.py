"""Hosts in network namespaces on one machine: two joined by a veth pair, or several joined by
a bridge. Traffic between them never leaves them.

The multi-host tests and ``robofleet bench fleet --hosts`` build their hosts here. Everything
started inside the namespaces belongs to the caller, so teardown SIGKILLs it by pid and deletes
the namespaces (with their veths and the bridge), also when the caller fails.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import NamedTuple


class TwoHosts(NamedTuple):
    ns_a: str
    ns_b: str
    ip_a: str
    ip_b: str
    dev_a: str
    dev_b: str


class Hosts(NamedTuple):
    """``namespaces[i]`` has address ``ips[i]`` on a /24 that a bridge in the namespace
    ``switch`` joins."""

    namespaces: list[str]
    ips: list[str]
    switch: str

    def argv(self, i: int, *argv: str) -> list[str]:
        """``argv`` run inside host ``i``'s namespace."""
        return ["ip", "netns", "exec", self.namespaces[i], *argv]


def sh(*argv: str) -> None:
    """Run a set-up command; a failure raises with its stderr."""
    subprocess.run(argv, check=True, capture_output=True, text=True)


def netns_available(*tools: str) -> bool:
    """Root, and ``ip`` plus any extra ``tools`` (e.g. ``tc``) on PATH."""
    return os.geteuid() == 0 and all(shutil.which(t) for t in ("ip", *tools))


def _running(pid: int) -> bool:
    """Process ``pid`` exists and is not a zombie waiting for its parent."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def _teardown(namespaces: Sequence[str]) -> None:
    """SIGKILL every process in ``namespaces`` and delete them (their devices go with them)."""
    killed: list[int] = []
    for ns in namespaces:
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        for pid in map(int, pids.stdout.split()):
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 10.0  # gone (or reaped by their parents) before cleanup
    while any(_running(pid) for pid in killed) and time.monotonic() < deadline:
        time.sleep(0.05)
    for ns in namespaces:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _add_namespace(ns: str, created: list[str]) -> None:
    sh("ip", "netns", "add", ns)
    created.append(ns)
    sh("ip", "-n", ns, "link", "set", "lo", "up")


@contextmanager
def two_hosts(
    prefix: str, subnet: str, on_link: Callable[[str, str], None] | None = None
) -> Iterator[TwoHosts]:
    """Create namespaces ``<prefix>a-<tag>`` / ``<prefix>b-<tag>`` with ``<subnet>.1`` and
    ``<subnet>.2`` (a /24 that exists only between them); ``on_link(ns, dev)`` runs once per
    side after its device is up (e.g. to add a tc qdisc)."""
    tag = uuid.uuid4().hex[:6]
    hosts = TwoHosts(
        f"{prefix}a-{tag}", f"{prefix}b-{tag}", f"{subnet}.1", f"{subnet}.2",
        f"{prefix}a{tag}", f"{prefix}b{tag}",
    )  # fmt: skip
    created: list[str] = []
    try:
        for ns in (hosts.ns_a, hosts.ns_b):
            _add_namespace(ns, created)
        sh("ip", "link", "add", hosts.dev_a, "type", "veth", "peer", "name", hosts.dev_b)
        sh("ip", "link", "set", hosts.dev_a, "netns", hosts.ns_a)
        sh("ip", "link", "set", hosts.dev_b, "netns", hosts.ns_b)
        for ns, dev, ip in (
            (hosts.ns_a, hosts.dev_a, hosts.ip_a),
            (hosts.ns_b, hosts.dev_b, hosts.ip_b),
        ):
            sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            if on_link is not None:
                on_link(ns, dev)
        yield hosts
    finally:
        _teardown(created)


@contextmanager
def bridged_hosts(prefix: str, subnet: str, n: int) -> Iterator[Hosts]:
    """``n`` hosts: namespaces ``<prefix><i>-<tag>`` with ``<subnet>.<i+1>``, each with a veth
    whose peer is a port of the bridge ``br0`` in the namespace ``<prefix>s-<tag>`` (the
    switch). Nothing is added to the machine's own namespace, so deleting the namespaces
    removes every device.

    Raises:
        ValueError: ``n`` outside 1..250.
    """
    if not 1 <= n <= 250:
        raise ValueError(f"1 to 250 hosts, not {n}")
    tag = uuid.uuid4().hex[:6]
    switch = f"{prefix}s-{tag}"
    hosts = Hosts(
        [f"{prefix}{i}-{tag}" for i in range(n)], [f"{subnet}.{i + 1}" for i in range(n)], switch
    )
    created: list[str] = []
    try:
        _add_namespace(switch, created)
        sh("ip", "-n", switch, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", switch, "link", "set", "br0", "up")
        for i, (ns, ip) in enumerate(zip(hosts.namespaces, hosts.ips, strict=True)):
            _add_namespace(ns, created)
            dev, port = f"eth{i}", f"port{i}"
            sh("ip", "link", "add", f"{prefix}{i}{tag}", "netns", ns, "type", "veth",
               "peer", "name", port, "netns", switch)  # fmt: skip
            sh("ip", "-n", ns, "link", "set", f"{prefix}{i}{tag}", "name", dev)
            sh("ip", "-n", switch, "link", "set", port, "master", "br0")
            sh("ip", "-n", switch, "link", "set", port, "up")
            sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
        yield hosts
    finally:
        _teardown(created)
