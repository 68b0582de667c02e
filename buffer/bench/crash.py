"""``robofleet bench crash``: SIGKILL the buffer's process while writers stream; count losses.

Writer processes (one per robot) stream steps to a buffer server process
(:mod:`buffer.bench.crash_worker`) and log every acknowledged seq. The server is SIGKILLed at random
moments ``--kills`` times and restarted; after each restart its recovered contents are compared
with what had been acknowledged: ``acked_lost`` counts acknowledged seqs that are not stored,
``duplicates`` counts (robot, seq) pairs stored more than once. Both must be 0.

Prints a rich table, then one JSON object as the last line with ``kills``, ``acked_lost``,
``duplicates``, ``recovery_seconds_p50`` (the buffer's own open/recovery time) and more.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from foundation.clitext import plain_text


def _spawn_server(
    directory: Path, sock: Path
) -> tuple[subprocess.Popen[str], dict[str, Any], float]:
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "buffer.bench.crash_worker", "server", str(directory), str(sock)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"buffer server exited with {proc.wait()} before it was ready")
    return proc, json.loads(line), time.monotonic() - t0


def _acked(ack_dir: Path) -> dict[str, int]:
    out = {}
    for f in ack_dir.glob("*.acks"):
        lines = f.read_text().split()
        out[f.stem] = int(lines[-1]) if lines else -1
    return out


def check(acked: dict[str, int], robots: dict[str, Any]) -> tuple[int, int]:
    """(acknowledged seqs not stored, seqs stored twice) for acks ``0..acked[robot]``."""
    lost = 0
    dups = 0
    for robot, top in acked.items():
        info = robots.get(robot, {"runs": [], "duplicates": 0})
        dups += int(info["duplicates"])
        covered = 0
        for a, b in info["runs"]:
            lo, hi = max(a, 0), min(b, top)
            if hi >= lo:
                covered += hi - lo + 1
        lost += (top + 1) - covered
    for robot, info in robots.items():
        if robot not in acked:
            dups += int(info["duplicates"])
    return lost, dups


def _kill_and_restart(
    rng: random.Random, server: subprocess.Popen[str], data: Path, acks: Path, sock: Path
) -> tuple[subprocess.Popen[str], dict[str, Any], float, dict[str, int]]:
    """SIGKILL the server while writers stream (after fresh acknowledgements, at a random
    moment), restart it: ``(server, its ready message, restart seconds, acked before)``."""
    before = sum(_acked(acks).values())
    deadline = time.monotonic() + 30
    while sum(_acked(acks).values()) <= before and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(rng.uniform(0.0, 0.5))
    os.kill(server.pid, signal.SIGKILL)
    server.wait()
    acked = _acked(acks)  # everything acknowledged before the kill
    server, ready, restart_s = _spawn_server(data, sock)
    return server, ready, restart_s, acked


def run(kills: int, writers: int, seed: int, root: Path) -> dict[str, Any]:
    rng = random.Random(seed)
    data, acks, sock = root / "buffer", root / "acks", root / "buffer.sock"
    acks.mkdir()
    server, ready, _ = _spawn_server(data, sock)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "buffer.bench.crash_worker",
                "writer",
                str(sock),
                f"robot-{i}",
                str(acks / f"robot-{i}.acks"),
            ]
        )
        for i in range(writers)
    ]
    recoveries: list[float] = []
    restarts: list[float] = []
    lost_total = dups_total = 0
    try:
        for _ in range(kills):
            server, ready, restart_s, acked = _kill_and_restart(rng, server, data, acks, sock)
            lost, dups = check(acked, ready["robots"])
            lost_total += lost
            dups_total = max(dups_total, dups)
            recoveries.append(float(ready["recovery_seconds"]))
            restarts.append(restart_s)
    finally:
        for p in procs:
            p.kill()
            p.wait()
        server.kill()
        server.wait()
    acked = _acked(acks)
    server, ready, _ = _spawn_server(data, sock)
    server.kill()
    server.wait()
    lost, dups = check(acked, ready["robots"])
    lost_total += lost
    dups_total = max(dups_total, dups)
    return {
        "kills": kills,
        "writers": writers,
        "acked_lost": lost_total,
        "duplicates": dups_total,
        "acked_steps": sum(v + 1 for v in acked.values()),
        "stored_steps": int(ready["steps"]),
        "recovery_seconds_p50": round(float(np.median(recoveries)), 4) if recoveries else 0.0,
        "recovery_seconds_max": round(float(np.max(recoveries)), 4) if recoveries else 0.0,
        "restart_seconds_p50": round(float(np.median(restarts)), 4) if restarts else 0.0,
    }


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="robofleet bench crash", description=plain_text(__doc__))
    parser.add_argument("--config", default=None, help="robofleet settings file")
    parser.add_argument("--kills", type=int, default=20, help="SIGKILLs of the buffer process")
    parser.add_argument("--writers", type=int, default=4, help="writer processes (robots)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random kill times")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    parser.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    args = parser.parse_args(list(argv))
    root = Path(tempfile.mkdtemp(prefix="bench-crash-", dir=args.dir))
    try:
        result = run(args.kills, args.writers, args.seed, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if not args.json:
        from rich.console import Console
        from rich.table import Table

        t = Table(title=f"bench crash: {args.kills} SIGKILLs of the buffer process")
        t.add_column("measure")
        t.add_column("value", justify="right")
        t.add_column("must be", justify="right")
        t.add_row("acknowledged steps (total)", f"{result['acked_steps']:,}", "")
        t.add_row("stored steps after last restart", f"{result['stored_steps']:,}", ">= acked")
        t.add_row("acknowledged but lost", str(result["acked_lost"]), "0")
        t.add_row("stored twice", str(result["duplicates"]), "0")
        t.add_row(
            "recovery (open) p50 / max, s",
            f"{result['recovery_seconds_p50']:.3f} / {result['recovery_seconds_max']:.3f}",
            "",
        )
        t.add_row("restart incl. process start p50, s", f"{result['restart_seconds_p50']:.3f}", "")
        Console().print(t)
    sys.stdout.flush()
    print(json.dumps(result))
    return 0 if result["acked_lost"] == 0 and result["duplicates"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
