"""``robofleet bench fleet --hosts``: buffer shards spread over network-namespace hosts in one
Ray cluster, robots uploading to their shards' own ingest endpoints; its figures, and a tiny
run (2 hosts, 1 and 2 shards, 8 robots)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from robofleet.bench import fleet as F
from robofleet.bench import fleet_hosts as H
from robofleet.bench.netns import bridged_hosts, netns_available

NO_NETNS = "needs root and iproute2 (ip netns) for the namespace hosts"


def _case(shards: int, robots: int, p99: float, sent: int = 100, acked: int = 100) -> H.ShardedCase:
    return H.ShardedCase(
        "state", shards, robots, 4, 2, [1] * shards, acked, sent, 5.0, p99, 0, 0, 0.0,
        0.5, 1.0, 0.1, 50, 10, 80, 20, 130, robots, robots, 0, [1] * shards, 10, 1.0,
    )  # fmt: skip


def test_hosts_and_shards_are_parsed_and_one_host_refused() -> None:
    args = F.parse_args(["--hosts", "4", "--shards", "1,2,4", "--robots", "64,256"])
    assert (args.hosts, args.shards, args.robots) == (4, [1, 2, 4], [64, 256])
    assert F.parse_args([]).hosts == 0  # one cloud process, as before
    for bad in (["--hosts", "1"], ["--hosts", "-2"], ["--hosts", "2", "--shards", "0"]):
        with pytest.raises(SystemExit):
            F.parse_args(bad)


def test_robots_served_per_shard_count_and_the_scaling_efficiency() -> None:
    cases = [
        _case(1, 64, 20.0),
        _case(1, 256, 400.0),
        _case(2, 64, 10.0),
        _case(2, 256, 80.0),
        _case(4, 256, 30.0, sent=100, acked=99),  # an unacked batch disqualifies
        _case(4, 64, 40.0),
    ]
    assert H.served(cases, "state", 1) == 64
    assert H.served(cases, "state", 2) == 256
    assert H.efficiency(cases, "state", 2) == pytest.approx(256 / (2 * 64))
    assert H.efficiency(cases, "state", 4) == pytest.approx(64 / (4 * 64))
    assert H.efficiency([_case(1, 64, 500.0), _case(2, 64, 5.0)], "state", 2) is None
    assert H.efficiency([_case(1, 64, 5.0), _case(2, 64, 500.0)], "state", 2) == 0.0
    # one shard served the largest count tried: how many more it serves is not measured
    assert H.efficiency(cases, "state", 2, largest_tried=64) is None
    assert H.efficiency(cases, "state", 1, largest_tried=64) == 1.0
    args = F.parse_args(["--hosts", "4", "--shards", "1,2,4", "--kinds", "state"])
    out = H.result([*cases, _case(4, 1024, math.inf, acked=0)], args)
    assert out["largest_robots_ack_p99_under_100ms"] == {"state": {"1": 64, "2": 256, "4": 64}}
    # the default counts end at 256, which 2 shards served: a lower bound
    assert out["served_largest_tried"] == {"state": {"1": False, "2": True, "4": False}}
    assert out["scaling_efficiency"]["state"]["2"] == pytest.approx(2.0)
    assert out["cases"][-1]["p99_ms"] is None  # JSON has no infinity
    json.dumps(out)


def test_open_fds_counts_this_process_sockets() -> None:
    fds, sockets = H.open_fds(os.getpid())
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        more, more_sockets = H.open_fds(os.getpid())
    assert more == fds + 1 and more_sockets == sockets + 1


def _ours(prefix: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return [line for line in out.stdout.splitlines() if line.startswith(prefix)]


@pytest.mark.skipif(not netns_available(), reason=NO_NETNS)
def test_bridged_hosts_reach_each_other_and_leave_nothing_behind() -> None:
    code = "import socket; socket.create_connection(('{}', {}), timeout=10).close()"
    with bridged_hosts("rft", "10.219.41", 3) as h:
        server = subprocess.Popen(
            h.argv(2, sys.executable, "-c", f"import socket; s = socket.create_server(('{h.ips[2]}', "
                   "5007)); print('up', flush=True); s.accept()"),
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert server.stdout is not None and server.stdout.readline().strip() == "up"
        subprocess.run(h.argv(0, sys.executable, "-c", code.format(h.ips[2], 5007)), check=True)
        assert server.wait(10) == 0
        names = [*h.namespaces, h.switch]
        assert all(_ours(n) for n in names)
    assert not any(_ours(n) for n in names)  # namespaces, veths and the bridge are gone


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(not netns_available(), reason=NO_NETNS)
def test_shards_on_another_host_ack_every_batch_of_robots_routed_to_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    robots = 8
    before = set(_ours("rfh"))
    argv = ["--hosts", "2", "--shards", "1,2", "--robots", str(robots), "--kinds", "state"]
    argv += ["--seconds", "3", "--warmup", "2", "--drain", "15"]
    assert F.main(argv) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [(c["shards"], c["robots"]) for c in out["cases"]] == [(1, robots), (2, robots)]
    for c in out["cases"]:
        k = c["shards"]
        # every batch sent in the window was acked (8 robots x 2 batches/s x 3 s)
        assert c["sent"] >= 40 and c["acked"] == c["sent"], c
        assert c["p99_ms"] is not None and 0 < c["p50_ms"] <= c["p99_ms"], c
        # the shards ran on the shard host, and every step went through their endpoints
        assert c["shard_hosts"] == [1] * k, c
        assert c["cloud_rows"] == 0 and len(c["shard_rows"]) == k, c
        assert all(n > 0 for n in c["shard_rows"]), c
        assert sum(c["shard_rows"]) >= c["acked"] * 10, c  # 10 steps a batch, warm-up too
        assert c["data_plane_batches"] > 0, c
        # each robot asked the cloud for its route and opened a stream to its shard
        assert c["route_asks"] >= robots and c["shard_streams"] >= robots, c
        assert c["cores"] > 0 and c["ms_per_robot_s"] > 0, c
        # sockets: a few per robot connection, none per request
        assert 0 < c["cloud_sockets"] <= 4 * robots + 64, c
        assert 0 < c["shard_sockets"] <= 4 * robots + 64 * k, c
        assert c["cloud_fds"] + c["shard_fds"] - c["fds_start"] < c["sent"], c
    served = out["largest_robots_ack_p99_under_100ms"]["state"]
    assert set(served) == {"1", "2"}
    assert set(out["scaling_efficiency"]["state"]) == {"1", "2"}
    assert set(_ours("rfh")) <= before  # the hosts are gone
