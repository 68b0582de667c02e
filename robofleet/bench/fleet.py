"""``robofleet bench fleet``: how many robots one cloud process serves.

For each robot count (``--robots 16,64,256``) and step kind (``--kinds state,camera``) a fresh
cloud process (a real comms server, gRPC + ZeroMQ data plane, whose sink is a real replay
buffer: an ack means fdatasynced) takes the uploads of that many simulated robots. The robots
have no physics: each replays a recorded episode at 20 steps/s in batches of 10 steps (what the
edge agent's uplink cuts at 20 Hz with its 0.5 s batch delay) through a real uploader. They run
in ``--drivers`` driver processes that share this machine with the cloud process.

Measured over ``--seconds`` after a ``--warmup``: each batch's ack latency (spooled -> the ack
covering it; batches still unacked ``--drain`` s after the window count as never acked),
backpressure events the cloud sent, the cloud process's CPU time (``/proc/PID/stat``) per robot
(and, for reference, its CPU over 2 s with the robots enrolled before any uplink started), and
MB/s acked. The answer: the largest robot count whose ack p99 stays under 100 ms with every
batch acked, per step kind. Prints a table, then one JSON object as the last line.

``--hosts H --shards 1,2,4``: the same robots against buffer shards spread over H hosts in
network namespaces, each shard with its own ingest endpoint (``robofleet.bench.fleet_hosts``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from buffer.table.ack_phases import PHASES
from foundation.clitext import plain_text

if TYPE_CHECKING:
    from rich.console import Console

P99_LIMIT_MS = 100.0
IDLE_S = 2.0  # the cloud process's CPU is read this long before the uplinks start

_CLOUD = """
import sys
from robofleet.bench.fleet_procs import serve_cloud
serve_cloud(sys.argv[1], int(sys.argv[2]))
"""

_DRIVER = """
import json, sys
from robofleet.bench.fleet_procs import drive
c = json.loads(sys.stdin.readline())
robots = [tuple(r) for r in c["robots"]]
drive(c["address"], robots, c["kind"], c["batch_steps"], c["hz"], c.get("sharded", False))
"""


@dataclass(frozen=True)
class Case:
    """One (step kind, robot count) run's figures."""

    kind: str
    robots: int
    drivers: int
    acked: int  # batches spooled in the window and acked
    unacked: int  # batches spooled in the window, not acked by the end of the drain
    p50_ms: float
    p99_ms: float  # inf when a batch was never acked
    backpressure: int
    skipped: int  # batches the drivers did not produce (their spool cap was reached)
    late_s: float  # the most a driver's put came after its schedule
    cloud_cores: float  # cloud CPU s per wall s
    cloud_ms_per_robot_s: float  # cloud CPU ms per robot per wall s
    mb_per_s: float  # acked MB/s
    cloud_idle_cores: float = 0.0  # before the uplinks started (enrolled robots, no traffic)
    merged_share: float = 0.0  # uploads the buffer merged with others into one append
    fsyncs_per_append: float = 0.0  # WAL fdatasyncs per upload (group commit, merging)
    # mean ms of the buffer's append by phase (``buffer.table.ack_phases``): what of the ack
    # latency the buffer took, the rest being the transport and the queue before it
    append_phases_ms: dict[str, float] = field(default_factory=dict)


def parse_robots(text: str) -> list[int]:
    """``"16,64,256"`` -> ``[16, 64, 256]``.

    Raises:
        argparse.ArgumentTypeError: an entry that is not a positive integer.
    """
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"robot counts must be integers, got {text!r}") from None
    if not out or any(n <= 0 for n in out):
        raise argparse.ArgumentTypeError(f"robot counts must be positive, got {text!r}")
    return out


def parse_kinds(text: str) -> list[str]:
    """``"state,camera"`` -> ``["state", "camera"]``.

    Raises:
        argparse.ArgumentTypeError: an unknown kind.
    """
    out = [k.strip() for k in text.split(",") if k.strip()]
    bad = [k for k in out if k not in ("state", "camera")]
    if not out or bad:
        raise argparse.ArgumentTypeError(f"step kinds are state and camera, got {text!r}")
    return out


def latency_ms(latencies_s: Sequence[float], unacked: int) -> tuple[float, float]:
    """(p50, p99) in ms of the batches' ack latencies, a never-acked batch counting as
    infinitely late (so any unacked batch beyond the top 1% makes p99 infinite)."""
    x = np.asarray(list(latencies_s) + [np.inf] * unacked, dtype=np.float64) * 1000.0
    if x.size == 0:
        return float("nan"), float("nan")
    p50, p99 = np.quantile(x, [0.5, 0.99], method="higher")
    return float(p50), float(p99)


def cloud_per_robot(cpu_s: float, window_s: float, robots: int) -> tuple[float, float]:
    """(cloud cores used, cloud CPU ms per robot per second) over a window."""
    cores = cpu_s / window_s
    return cores, 1000.0 * cores / robots


def largest_under(cases: Sequence[Case], kind: str, limit_ms: float = P99_LIMIT_MS) -> int | None:
    """The most robots of ``kind`` whose ack p99 stayed under ``limit_ms`` with every batch
    acked; None when no count did."""
    ok = [c.robots for c in cases if c.kind == kind and c.unacked == 0 and c.p99_ms < limit_ms]
    return max(ok) if ok else None


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc/PID/stat``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def spawn(
    code: str, *args: str, prefix: Sequence[str] = (), env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """``python -c code args`` talking JSON lines on its stdin/stdout; ``prefix``: what runs
    it (``ip netns exec NS``, which execs it in place: the pid is Python's)."""
    return subprocess.Popen(
        [*prefix, sys.executable, "-c", code, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


def start_drivers(
    info: dict[str, Any],
    kind: str,
    n_drivers: int,
    args: argparse.Namespace,
    prefix: Sequence[str] = (),
    sharded: bool = False,
) -> list[subprocess.Popen[str]]:
    """Driver processes, each with a share of the robots, once all said ``ready``
    (``prefix``: as :func:`spawn`; ``sharded``: the robots upload to their shards)."""
    robots = info["robots"]
    groups = [robots[i::n_drivers] for i in range(n_drivers) if robots[i::n_drivers]]
    procs = []
    for group in groups:
        p = spawn(_DRIVER, prefix=prefix)
        assert p.stdin is not None
        conf = {"address": info["address"], "robots": group, "kind": kind, "sharded": sharded}
        conf.update(batch_steps=args.batch_steps, hz=args.hz)
        p.stdin.write(json.dumps(conf) + "\n")
        p.stdin.flush()
        procs.append(p)
    for p in procs:
        assert p.stdout is not None
        line = p.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"a driver process did not start (said {line!r})")
    return procs


def release(procs: Sequence[subprocess.Popen[str]], args: argparse.Namespace) -> float:
    """Tell the ready drivers when to start (a second from now, wall clock) and the window;
    returns that start."""
    start = time.time() + 1.0
    timing = json.dumps([start, args.warmup, args.seconds, args.drain]) + "\n"
    for p in procs:
        assert p.stdin is not None
        p.stdin.write(timing)
        p.stdin.flush()
    return start


def run_case(kind: str, robots: int, args: argparse.Namespace) -> Case:
    """One fresh cloud process, ``robots`` uplinks in driver processes, one measured window."""
    cloud = spawn(_CLOUD, kind, str(robots))
    procs: list[subprocess.Popen[str]] = []
    try:
        assert cloud.stdout is not None and cloud.stdin is not None
        info = json.loads(cloud.stdout.readline())
        idle0, i0 = proc_cpu_s(cloud.pid), time.monotonic()
        time.sleep(IDLE_S)  # the cloud with its robots enrolled, before any uplink
        idle_cores = (proc_cpu_s(cloud.pid) - idle0) / (time.monotonic() - i0)
        procs = start_drivers(info, kind, min(args.drivers, robots), args)
        start = release(procs, args)
        time.sleep(max(0.0, start + args.warmup - time.time()))
        cpu0, t0 = proc_cpu_s(cloud.pid), time.monotonic()
        time.sleep(max(0.0, start + args.warmup + args.seconds - time.time()))
        cpu1, t1 = proc_cpu_s(cloud.pid), time.monotonic()
        figures = [
            json.loads(p.communicate("", timeout=args.drain + 120)[0].splitlines()[-1])
            for p in procs
        ]
        buffer_figures = json.loads(cloud.communicate("", timeout=120)[0].splitlines()[-1])
    finally:
        for p in [*procs, cloud]:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    case = _case(kind, robots, len(procs), figures, cpu1 - cpu0, t1 - t0)
    appends = max(int(buffer_figures["appends"]), 1)  # over the whole run, warm-up included
    return replace(
        case,
        cloud_idle_cores=idle_cores,
        merged_share=buffer_figures["merged_appends"] / appends,
        fsyncs_per_append=buffer_figures["fsyncs"] / appends,
        append_phases_ms={k: float(buffer_figures[k]) for k in PHASES},
    )


def _case(
    kind: str, robots: int, drivers: int, figures: list[dict[str, Any]], cpu_s: float, wall: float
) -> Case:
    lat = [x for f in figures for x in f["latencies"]]
    unacked = sum(f["unacked"] for f in figures)
    p50, p99 = latency_ms(lat, unacked)
    cores, per_robot = cloud_per_robot(cpu_s, wall, robots)
    return Case(
        kind=kind,
        robots=robots,
        drivers=drivers,
        acked=len(lat),
        unacked=unacked,
        p50_ms=p50,
        p99_ms=p99,
        backpressure=sum(f["backpressure"] for f in figures),
        skipped=sum(f["skipped"] for f in figures),
        late_s=max(f["late_s"] for f in figures),
        cloud_cores=cores,
        cloud_ms_per_robot_s=per_robot,
        mb_per_s=sum(f["acked_bytes"] for f in figures) / wall / 1e6,
    )


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="robofleet bench fleet", description=plain_text(__doc__))
    parser.add_argument("--config", default=None, help="robofleet settings file")
    parser.add_argument(
        "--robots",
        type=parse_robots,
        default=[16, 64, 256],
        help="robot counts (default 16,64,256)",
    )
    parser.add_argument(
        "--kinds",
        type=parse_kinds,
        default=["state", "camera"],
        help="step kinds: state, camera (default both)",
    )
    parser.add_argument("--drivers", type=int, default=2, help="uplink driver processes")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured window")
    parser.add_argument("--warmup", type=float, default=3.0, help="s before the measured window")
    parser.add_argument("--drain", type=float, default=20.0, help="s to wait for late acks")
    parser.add_argument("--hz", type=float, default=20.0, help="steps/s of each robot")
    parser.add_argument("--batch-steps", type=int, default=10, help="steps per uploaded batch")
    parser.add_argument(
        "--hosts",
        type=int,
        default=0,
        help="across network-namespace hosts (needs root): host 0 runs the Ray head, the cloud "
        "and the drivers, hosts 1.. the buffer shards (0: one cloud process, no shards)",
    )
    parser.add_argument(
        "--shards",
        type=parse_robots,
        default=[1, 2, 4],
        help="with --hosts: buffer shard counts, each with its own ingest endpoint",
    )
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args(list(argv))
    if args.drivers < 1 or args.seconds <= 0 or args.hz <= 0 or args.batch_steps < 1:
        parser.error("--drivers, --seconds, --hz and --batch-steps must be positive")
    if args.hosts == 1 or args.hosts < 0:
        parser.error("--hosts needs 2 or more (host 0 for the cloud, the others for shards)")
    return args


def finite(d: dict[str, Any]) -> dict[str, Any]:
    """``d`` with its infinite floats as None: JSON has no infinity."""
    return {k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in d.items()}


def result(cases: Sequence[Case], kinds: Sequence[str]) -> dict[str, Any]:
    """The JSON line's object (infinite latencies as null)."""
    return {
        "largest_robots_ack_p99_under_100ms": {k: largest_under(cases, k) for k in kinds},
        "cases": [finite(asdict(c)) for c in cases],
    }


def print_table(
    title: str, cols: Sequence[str], rows: Iterable[Sequence[str]], width: int
) -> Console:
    """Print a table of right-aligned columns at least ``width`` characters wide (so a log
    file keeps its columns); the console, for the lines that follow it."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for col in cols:
        t.add_column(col, justify="right")
    for row in rows:
        t.add_row(*row)
    con = Console(width=max(width, Console().width))
    con.print(t)
    return con


def _print_table(cases: Sequence[Case], args: argparse.Namespace) -> None:
    title = (
        f"one cloud process (comms server + replay buffer, acks after fdatasync); robots "
        f"at {args.hz:g} Hz in {args.batch_steps}-step batches, played by uplink driver "
        f"processes on the same {os.cpu_count()}-core machine; {args.seconds:g} s measured"
    )
    cols = [
        "steps",
        "robots",
        "driver procs",
        "batches acked",
        "unacked",
        "ack p50 ms",
        "ack p99 ms",
        "backpressure",
        "skipped / late s",
        "cloud cores (idle)",
        "cloud CPU ms per robot-s",
        "uploads merged",
        "fdatasyncs per upload",
        "buffer append ms: stage / write / sync / visible",
        "MB/s acked",
    ]
    rows = [
        (
            c.kind,
            str(c.robots),
            str(c.drivers),
            str(c.acked),
            str(c.unacked),
            f"{c.p50_ms:.1f}",
            f"{c.p99_ms:.1f}",
            str(c.backpressure),
            f"{c.skipped} / {c.late_s:.2f}",
            f"{c.cloud_cores:.2f} ({c.cloud_idle_cores:.2f})",
            f"{c.cloud_ms_per_robot_s:.2f}",
            f"{c.merged_share:.0%}",
            f"{c.fsyncs_per_append:.2f}",
            " / ".join(f"{c.append_phases_ms.get(k, 0.0):.1f}" for k in PHASES),
            f"{c.mb_per_s:.1f}",
        )
        for c in cases
    ]
    con = print_table(title, cols, rows, 200)
    for k in args.kinds:
        n = largest_under(cases, k)
        con.print(f"{k} steps: largest robot count with ack p99 < {P99_LIMIT_MS:g} ms: {n}")


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    if args.hosts:
        from robofleet.bench import fleet_hosts

        return fleet_hosts.main(args)
    cases = [run_case(kind, n, args) for kind in args.kinds for n in args.robots]
    if not args.json:
        _print_table(cases, args)
    print(json.dumps(result(cases, args.kinds)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
