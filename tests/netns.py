"""Two test hosts in network namespaces joined by a veth pair (traffic never leaves them).

Shared by the robot-computer-on-its-own-network, multi-host deploy and WAN tests. Everything
started inside the namespaces belongs to the test, so teardown SIGKILLs it by pid and deletes
the namespaces, also when the test fails.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple


class TwoHosts(NamedTuple):
    ns_a: str
    ns_b: str
    ip_a: str
    ip_b: str
    dev_a: str
    dev_b: str


def sh(*argv: str) -> None:
    """Run a set-up command; a failure raises with its stderr."""
    subprocess.run(argv, check=True, capture_output=True, text=True)


def netns_available(*tools: str) -> bool:
    """Root, and ``ip`` plus any extra ``tools`` (e.g. ``tc``) on PATH."""
    return os.geteuid() == 0 and all(shutil.which(t) for t in ("ip", *tools))


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
            sh("ip", "netns", "add", ns)
            created.append(ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
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
        for ns in created:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
            for pid in pids.stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
