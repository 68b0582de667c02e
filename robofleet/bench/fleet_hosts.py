"""``robofleet bench fleet --hosts H --shards 1,2,4``: robots served by buffer shards spread
over hosts.

The hosts are network namespaces on this machine joined by a bridge
(``robofleet.bench.netns.bridged_hosts``), one Ray cluster across them: host 0 runs the Ray
head, the cloud process and the robots' driver processes; hosts 1..H-1 are Ray workers that
offer the shard resource (``fleet_procs.SHARD_RESOURCE``), so the shards run only there, spread
over them by Ray (``SPREAD``). For each step kind, shard count k and robot count N a fresh cloud
process (``fleet_procs.serve_sharded_cloud``) starts k ``BufferShard`` actors, each with its own
ingest endpoint (gRPC + ZeroMQ data plane, acks after the shard's fdatasync), and enrolls N
robots. The driver processes play the robots as ``robofleet bench fleet`` does (a recorded
episode at ``--hz`` in ``--batch-steps`` batches, real uploaders), each robot asking the cloud
for its route (``Ingest.Route``: its shard's address and ticket) and uploading straight to its
shard, so every batch crosses the bridge from host 0 to a shard host.

Measured over ``--seconds`` after ``--warmup``: each batch's ack latency, batches acked of those
sent, the CPU of the cloud process and the shard processes (``/proc/PID/stat``; Ray's own
daemons are not counted) per robot-second, and the open file descriptors and sockets of the
cloud and of the shards (``/proc/PID/fd``) at the window's start and end. Per kind: the largest
N whose ack p99 stays under 100 ms with every batch acked, for each k, and the scaling
efficiency ``served(k) / (k x served(1))``. Prints a table, then one JSON object as the last
line.

The namespaces share this machine's cores, so the figures show scaling only on a machine with
cores to spare for every host.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from robofleet.bench.fleet import (
    P99_LIMIT_MS,
    finite,
    latency_ms,
    print_table,
    proc_cpu_s,
    release,
    spawn,
    start_drivers,
)
from robofleet.bench.fleet_procs import SHARD_RESOURCE
from robofleet.bench.netns import Hosts, bridged_hosts, netns_available

SUBNET = "10.219.40"
RAY_PORT = 6379
OBJECT_STORE_BYTES = 100_000_000  # a node's Ray object store (the steps never cross Ray)
SHARDS_PER_HOST = 64  # shard resource units each shard host offers
START_S = 600.0  # the most a cloud process may take to start its shards and enroll its robots

_SHARDED_CLOUD = """
import sys
from robofleet.bench.fleet_procs import serve_sharded_cloud
serve_sharded_cloud(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:7])
"""


@dataclass(frozen=True)
class ShardedCase:
    """One (step kind, shard count, robot count) run's figures across the hosts."""

    kind: str
    shards: int
    robots: int
    hosts: int
    drivers: int
    shard_hosts: list[int]  # the host each shard ran on, shard k at k
    acked: int  # batches spooled in the window and acked
    sent: int  # batches spooled in the window
    p50_ms: float
    p99_ms: float  # inf when a batch was never acked
    backpressure: int
    skipped: int  # batches the drivers did not produce (their spool cap was reached)
    late_s: float  # the most a driver's put came after its schedule
    cores: float  # CPU s of the cloud and shard processes per wall s
    ms_per_robot_s: float  # the same, ms per robot per wall s
    cloud_cores: float  # the cloud process's part
    cloud_fds: int  # open at the window's end
    cloud_sockets: int
    shard_fds: int  # every shard's together, at the window's end
    shard_sockets: int
    fds_start: int  # cloud + shards at the window's start
    route_asks: int  # Ingest.Route calls the robots made
    shard_streams: int  # upload streams the robots opened to shards
    cloud_rows: int  # rows stored through the cloud's own upload streams
    shard_rows: list[int]  # rows stored through each shard's endpoint
    data_plane_batches: int  # batches that came on the shards' ZeroMQ data planes
    mb_per_s: float  # acked MB/s

    @property
    def unacked(self) -> int:
        return self.sent - self.acked


def open_fds(pid: int) -> tuple[int, int]:
    """(open file descriptors, of them sockets) of process ``pid`` (``/proc/PID/fd``)."""
    fds = sockets = 0
    base = f"/proc/{pid}/fd"
    for name in os.listdir(base):
        try:
            link = os.readlink(f"{base}/{name}")
        except OSError:
            continue  # closed meanwhile
        fds += 1
        sockets += link.startswith("socket:")
    return fds, sockets


def served(cases: Sequence[ShardedCase], kind: str, shards: int) -> int | None:
    """The most robots of ``kind`` that ``shards`` shards acked with p99 under the limit and
    every batch acked; None when no count did."""
    ok = [
        c.robots
        for c in cases
        if c.kind == kind and c.shards == shards and c.unacked == 0 and c.p99_ms < P99_LIMIT_MS
    ]
    return max(ok) if ok else None


def efficiency(
    cases: Sequence[ShardedCase], kind: str, shards: int, largest_tried: int | None = None
) -> float | None:
    """``served(k) / (k x served(1))``: 1.0 when k shards serve k times the robots one does.
    None without a served count for one shard (no k=1 case, or none under the limit), or,
    for k > 1, when one shard already served ``largest_tried`` (the largest count tried: how
    many more it serves is not measured). Where k shards served ``largest_tried`` the figure
    is a lower bound."""
    one = served(cases, kind, 1)
    if not one or (shards > 1 and one == largest_tried):
        return None
    return (served(cases, kind, shards) or 0) / (shards * one)


@dataclass(frozen=True)
class Cluster:
    """The hosts and the Ray cluster across them (``address``: the head's, on host 0)."""

    hosts: Hosts
    env: dict[str, str]
    address: str
    tmp: Path


def _ray(hosts: Hosts, i: int, env: dict[str, str], *argv: str) -> None:
    ray = str(Path(sys.executable).parent / "ray")
    out = subprocess.run(
        hosts.argv(i, ray, "start", *argv), env=env, capture_output=True, text=True, timeout=180
    )
    if out.returncode != 0:
        raise RuntimeError(f"ray start on host {i} failed: {out.stderr[-3000:]}")


@contextmanager
def cluster(n_hosts: int, subnet: str = SUBNET) -> Iterator[Cluster]:
    """``n_hosts`` hosts and one Ray cluster (token-authenticated) across them; everything is
    killed and the namespaces, devices and Ray's temp dir are removed on the way out."""
    tmp = Path(tempfile.mkdtemp(prefix="rf-fleet-"))
    env = {
        **os.environ,
        "RAY_USAGE_STATS_ENABLED": "0",
        # Ray's multi-node guard, which the suite sets to keep its Ray on one node.
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
    }
    ray_tmp: str | None = None
    try:
        with bridged_hosts("rfh", subnet, n_hosts) as hosts:
            # Short: Ray's AF_UNIX paths under it stay below 108 bytes.
            ray_tmp = f"/tmp/rf-{hosts.switch}"
            common = (f"--temp-dir={ray_tmp}", f"--object-store-memory={OBJECT_STORE_BYTES}")
            head = hosts.ips[0]
            _ray(hosts, 0, env, "--head", f"--node-ip-address={head}",
                 f"--port={RAY_PORT}", "--num-cpus=1", "--include-dashboard=false",
                 "--disable-usage-stats", *common)  # fmt: skip
            for i in range(1, n_hosts):
                _ray(hosts, i, env, f"--address={head}:{RAY_PORT}",
                     f"--node-ip-address={hosts.ips[i]}", "--num-cpus=1",
                     "--resources=" + json.dumps({SHARD_RESOURCE: SHARDS_PER_HOST}),
                     *common)  # fmt: skip
            yield Cluster(hosts, env, f"{head}:{RAY_PORT}", tmp)
    finally:
        # after the namespaces' processes (Ray's among them) were killed on leaving them
        if ray_tmp is not None:
            shutil.rmtree(ray_tmp, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)


def _stop(procs: Sequence[subprocess.Popen[str]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def run_case(
    cl: Cluster, kind: str, shards: int, robots: int, args: argparse.Namespace
) -> ShardedCase:
    """A fresh cloud process with ``shards`` shards on the shard hosts, ``robots`` uplinks in
    driver processes on host 0, one measured window."""
    root = Path(tempfile.mkdtemp(prefix=f"{kind}-{shards}-{robots}-", dir=cl.tmp))
    head = cl.hosts.ips[0]
    argv = (kind, str(robots), str(shards), cl.address, head, str(root / "buffer"))
    cloud = spawn(_SHARDED_CLOUD, *argv, prefix=cl.hosts.argv(0), env=cl.env)
    procs: list[subprocess.Popen[str]] = []
    try:
        assert cloud.stdout is not None
        ready, _, _ = select.select([cloud.stdout], [], [], START_S)
        line = cloud.stdout.readline() if ready else ""
        if not line:
            raise RuntimeError(
                f"the sharded cloud process did not start within {START_S:g} s "
                f"(exit code {cloud.poll()})"
            )
        info = json.loads(line)
        pids = [cloud.pid, *info["shard_pids"]]
        shard_hosts = [cl.hosts.ips.index(a.rsplit(":", 1)[0]) for a in info["shard_addresses"]]
        n_drivers = min(args.drivers, robots)
        procs = start_drivers(info, kind, n_drivers, args, cl.hosts.argv(0), sharded=True)
        start = release(procs, args)
        time.sleep(max(0.0, start + args.warmup - time.time()))
        fds0 = sum(open_fds(p)[0] for p in pids)
        cpu0 = [proc_cpu_s(p) for p in pids]
        t0 = time.monotonic()
        time.sleep(max(0.0, start + args.warmup + args.seconds - time.time()))
        cpu1 = [proc_cpu_s(p) for p in pids]
        t1 = time.monotonic()
        cloud_fds, cloud_sockets = open_fds(cloud.pid)
        at_shards = [open_fds(p) for p in info["shard_pids"]]
        figures = [
            json.loads(p.communicate("", timeout=args.drain + 120)[0].splitlines()[-1])
            for p in procs
        ]
        final = json.loads(cloud.communicate("", timeout=120)[0].splitlines()[-1])
    finally:
        _stop([*procs, cloud])
        shutil.rmtree(root, ignore_errors=True)
    wall = t1 - t0
    lat = [x for f in figures for x in f["latencies"]]
    unacked = sum(f["unacked"] for f in figures)
    p50, p99 = latency_ms(lat, unacked)
    cores = sum(b - a for a, b in zip(cpu0, cpu1, strict=True)) / wall
    return ShardedCase(
        kind=kind,
        shards=shards,
        robots=robots,
        hosts=len(cl.hosts.namespaces),
        drivers=len(procs),
        shard_hosts=shard_hosts,
        acked=len(lat),
        sent=len(lat) + unacked,
        p50_ms=p50,
        p99_ms=p99,
        backpressure=sum(f["backpressure"] for f in figures),
        skipped=sum(f["skipped"] for f in figures),
        late_s=max(f["late_s"] for f in figures),
        cores=cores,
        ms_per_robot_s=1000.0 * cores / robots,
        cloud_cores=(cpu1[0] - cpu0[0]) / wall,
        cloud_fds=cloud_fds,
        cloud_sockets=cloud_sockets,
        shard_fds=sum(f for f, _ in at_shards),
        shard_sockets=sum(s for _, s in at_shards),
        fds_start=fds0,
        route_asks=sum(f["route_asks"] for f in figures),
        shard_streams=sum(f["shard_streams"] for f in figures),
        cloud_rows=int(final["cloud_rows"]),
        shard_rows=[int(n) for n in final["shard_rows"]],
        data_plane_batches=sum(int(n) for n in final["data_plane_batches"]),
        mb_per_s=sum(f["acked_bytes"] for f in figures) / wall / 1e6,
    )


def result(cases: Sequence[ShardedCase], args: argparse.Namespace) -> dict[str, Any]:
    """The JSON line's object (infinite latencies as null; shard counts as string keys)."""
    top = max(args.robots)
    return {
        "hosts": args.hosts,
        "largest_robots_ack_p99_under_100ms": {
            kind: {str(k): served(cases, kind, k) for k in args.shards} for kind in args.kinds
        },
        "scaling_efficiency": {
            kind: {str(k): efficiency(cases, kind, k, top) for k in args.shards}
            for kind in args.kinds
        },
        # served at the largest count tried: the shards may serve more (a lower bound)
        "served_largest_tried": {
            kind: {str(k): served(cases, kind, k) == top for k in args.shards}
            for kind in args.kinds
        },
        "cases": [finite(asdict(c)) for c in cases],
    }


def _print_table(cases: Sequence[ShardedCase], args: argparse.Namespace) -> None:
    title = (
        f"buffer shards over {args.hosts} network-namespace hosts (host 0: Ray head, cloud, "
        f"{args.drivers} driver processes; hosts 1-{args.hosts - 1}: shards, each with its ingest "
        f"endpoint); robots at {args.hz:g} Hz in {args.batch_steps}-step batches; "
        f"{args.seconds:g} s measured; all hosts share this machine's {os.cpu_count()} cores"
    )
    cols = [
        "steps",
        "shards",
        "robots",
        "shard hosts",
        "batches acked / sent",
        "ack p50 ms",
        "ack p99 ms",
        "backpressure",
        "cores (cloud)",
        "CPU ms per robot-s",
        "cloud fds / sockets",
        "shard fds / sockets",
        "fds start -> end",
        "rows cloud / shards",
        "MB/s acked",
    ]
    rows = [
        (
            c.kind,
            str(c.shards),
            str(c.robots),
            ",".join(map(str, c.shard_hosts)),
            f"{c.acked} / {c.sent}",
            f"{c.p50_ms:.1f}",
            f"{c.p99_ms:.1f}",
            str(c.backpressure),
            f"{c.cores:.2f} ({c.cloud_cores:.2f})",
            f"{c.ms_per_robot_s:.2f}",
            f"{c.cloud_fds} / {c.cloud_sockets}",
            f"{c.shard_fds} / {c.shard_sockets}",
            f"{c.fds_start} -> {c.cloud_fds + c.shard_fds}",
            f"{c.cloud_rows} / {sum(c.shard_rows)}",
            f"{c.mb_per_s:.1f}",
        )
        for c in cases
    ]
    con = print_table(title, cols, rows, 220)
    for kind in args.kinds:
        for k in args.shards:
            top = max(args.robots)
            e, n = efficiency(cases, kind, k, top), served(cases, kind, k)
            if e is None:
                why = "no count served" if not served(cases, kind, 1) else "served all counts"
                eff = f"not measured (1 shard {why})"
            else:
                eff = f"{'>= ' if n == top and k > 1 else ''}{e:.2f}"
            more = " (the largest count tried: it may serve more)" if n == top else ""
            con.print(
                f"{kind} steps, {k} shard(s): largest robot count with ack p99 < "
                f"{P99_LIMIT_MS:g} ms: {n}{more}; scaling efficiency: {eff}"
            )


def main(args: argparse.Namespace) -> int:
    if not netns_available():
        print("robofleet bench fleet --hosts: needs root and iproute2 (ip netns)", file=sys.stderr)
        return 2
    with cluster(args.hosts) as cl:
        cases = [
            run_case(cl, kind, k, n, args)
            for kind in args.kinds
            for k in args.shards
            for n in args.robots
        ]
    if not args.json:
        _print_table(cases, args)
    print(json.dumps(result(cases, args)))
    return 0
