"""A site behind a slow WAN link: a relay and 4 robots in one network namespace, the cloud in
another, joined by a veth pair shaped with ``tc ... tbf`` (bandwidth); a TCP proxy at the
site's end adds latency and cuts connections (``tc netem`` is not available here).

Shows that a new weight version reaches all 4 robots in about one transfer time of the version
over the link (not four), and that uploads continue through dropped connections with nothing
lost or duplicated in the cloud.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.procs import Child, python_module
from tests.netns import netns_available, sh, two_hosts

pytestmark = pytest.mark.slow

SUBNET = "10.214.88"
RATE_MBIT = 40  # the WAN link, each way
VERSION_FLOATS = 2_000_000  # 8 MB per version: 1.6 s over the link
PROXY_LATENCY_S = 0.005  # added per forwarded read, each way


def _netns_available() -> bool:
    return netns_available("tc")


def _shape(ns: str, dev: str) -> None:
    sh(
        "ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
        "rate", f"{RATE_MBIT}mbit", "burst", "64kb", "latency", "2s",
    )  # fmt: skip


@pytest.fixture
def wan() -> Iterator[tuple[str, str, str]]:
    """(cloud namespace, site namespace, cloud IP), joined by a tbf-shaped veth pair."""
    with two_hosts("rfw", SUBNET, on_link=_shape) as h:
        yield h.ns_a, h.ns_b, h.ip_a


def _driver(ns: str, args: list[str], log: Path) -> Child:
    """A tests.comms.wan_driver process in namespace ``ns``, spoken to in JSON lines."""
    argv = ["ip", "netns", "exec", ns, *python_module("tests.comms.wan_driver", *args)]
    return Child(argv, log=log, stdin=True)


@pytest.mark.skipif(not _netns_available(), reason="needs root, iproute2 and tc for namespaces")
@pytest.mark.timeout(240)
def test_site_behind_slow_link_gets_each_version_once_and_uploads_survive_drops(
    wan: tuple[str, str, str], tmp_path: Path
) -> None:
    cloud_ns, site_ns, cloud_ip = wan
    drivers: list[Child] = []
    try:
        cloud = _driver(
            cloud_ns,
            ["cloud", cloud_ip, f"sqlite:///{tmp_path}/meta.db", "4", str(VERSION_FLOATS)],
            tmp_path / "cloud.log",
        )
        drivers.append(cloud)
        hello = cloud.json(90)
        site = _driver(
            site_ns,
            [
                "site",
                f"{cloud_ip}:{hello['port']}",
                json.dumps(hello["robots"]),
                str(PROXY_LATENCY_S),
            ],
            tmp_path / "site.log",
        )
        drivers.append(site)
        assert site.json(90)["ready"]

        one_copy_s = VERSION_FLOATS * 4 / (RATE_MBIT * 1e6 / 8)  # 1.6 s
        # Version 1 opens the relay's subscription; version 2 is timed.
        v1 = cloud.ask("publish", 30)
        assert len(site.ask(f"applied {v1['version']} 60", 70)["at"]) == 4
        before = site.ask("applied 1 0", 10)["link_bytes_down"]
        before += cloud.ask("stats", 10)["data_plane_bytes"]
        v2 = cloud.ask("publish", 30)
        got = site.ask(f"applied {v2['version']} 60", 70)
        got["link_bytes_down"] += cloud.ask("stats", 10)["data_plane_bytes"]
        assert len(got["at"]) == 4, got
        took = max(got["at"].values()) - v2["published_at"]
        crossed = got["link_bytes_down"] - before
        print(
            f"version of {v2['payload_bytes']} B to 4 robots in {took:.2f} s; one copy {one_copy_s:.2f} s; {crossed} B crossed"
        )
        # The link really is the bottleneck (the shaping works) ...
        assert took >= 0.8 * one_copy_s, (took, one_copy_s)
        # ... and all 4 robots have the version in about one transfer time, not four.
        assert took <= 2.2 * one_copy_s, (took, one_copy_s)
        assert v2["payload_bytes"] <= crossed < 1.1 * v2["payload_bytes"], crossed

        # Uploads keep flowing while the link is cut twice, and land exactly once.
        for _ in range(2):
            assert site.ask("drop", 10)["dropped"]
            time.sleep(1.5)
        done = site.ask("stop_producing 60", 90)
        assert all(done["durable"]), done
        assert min(done["reconnects"]) >= 1, done  # every robot's stream really was cut
        seqs = cloud.ask("stats", 30)["seqs"]
        robot_ids = [str(r) for r, _ in hello["robots"]]
        for rid, last in zip(robot_ids, done["last_seq"], strict=True):
            assert seqs[rid] == list(range(last + 1)), rid  # nothing lost, nothing twice
    finally:
        for d in reversed(drivers):
            d.stop(15)
