"""Control-loop latency of N edge agents on this machine (one process per robot).

``python -m edge_agent.latency_report --agents 4 --hz 20 --seconds 20`` runs N simulated
Meta-World robots (real MuJoCo physics, scripted expert with HG-DAgger gating, a local MLP
policy, the durable spool with fsync) at the given rate, then prints a table and, as the last
stdout line, one JSON object. Latency = observation read to row queued (policy, operator,
``send_action``, physics step, recording); an overrun is a step that missed its tick.
This is a measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def _one(
    i: int, hz: float, seconds: float, spool_root: str, driver: str, task: str, rt: int | None
) -> dict[str, Any]:
    import threading

    from comms.config import CommsSettings
    from edge_agent.build import AgentOptions, build_agent
    from edge_agent.config import EdgeSettings

    edge = EdgeSettings(control_hz=hz, realtime_priority=rt)
    opts = AgentOptions(
        robot_name=f"latency-{i}",
        tasks=[task],
        driver=driver,
        operator="scripted",
        max_episode_steps=200,
        spool_dir=Path(spool_root) / f"r{i}-{rt}",
    )
    built = build_agent(edge, CommsSettings(), opts)
    agent = built.agent
    timer = threading.Timer(seconds, agent.stop)
    timer.start()
    try:
        report = agent.run()
    finally:
        timer.cancel()
        built.close()
    return {"report": report, "latencies": list(agent.stats.latencies)}


def main(argv: Sequence[str] = ()) -> int:
    p = argparse.ArgumentParser(prog="python -m edge_agent.latency_report")
    p.add_argument("--config", default=None, help="accepted for symmetry; unused")
    p.add_argument("--agents", type=int, default=4, help="edge agents, one robot each")
    p.add_argument("--hz", type=float, default=20.0, help="control rate of each agent")
    p.add_argument("--seconds", type=float, default=20.0, help="measured seconds per mode")
    p.add_argument("--driver", default="metaworld", help="hal driver kind (a scripted expert's)")
    p.add_argument("--task", default="reach-v3", help="the robots' task")
    p.add_argument(
        "--realtime",
        type=int,
        default=None,
        help="also measure with the control thread under SCHED_FIFO at this priority",
    )
    args = p.parse_args(list(argv))
    modes: list[int | None] = [None] if args.realtime is None else [None, args.realtime]
    outs = []
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"edge control loop: {args.agents} agents at {args.hz:g} Hz")
    for col in ("scheduler", "agent", "steps", "p50 ms", "p99 ms", "max ms", "overruns", "loop Hz"):
        table.add_column(col, justify="right")
    for rt in modes:
        out, results = _measure(args, rt)
        outs.append(out)
        name = "default" if rt is None else f"SCHED_FIFO {rt}"
        for i, r in enumerate(results):
            rep = r["report"]
            table.add_row(
                name,
                str(i),
                str(int(rep["steps"])),
                f"{rep['latency_p50_ms']:.2f}",
                f"{rep['latency_p99_ms']:.2f}",
                f"{rep['latency_max_ms']:.2f}",
                str(int(rep["overruns"])),
                f"{rep['loop_hz']:.2f}",
            )
        table.add_row(
            name,
            "all",
            str(out["steps"]),
            f"{out['latency_p50_ms']:.2f}",
            f"{out['latency_p99_ms']:.2f}",
            f"{out['latency_max_ms']:.2f}",
            str(out["overruns"]),
            f"{out['loop_hz_mean']:.2f}",
        )
    Console().print(table)
    final: dict[str, Any] = {"default": outs[0]}
    if len(outs) > 1:
        final["realtime"] = outs[1]
        final["p99_ratio_realtime_vs_default"] = round(
            outs[1]["latency_p99_ms"] / max(outs[0]["latency_p99_ms"], 1e-9), 4
        )
    print(json.dumps(final))
    return 0


def _measure(args: argparse.Namespace, rt: int | None) -> tuple[dict[str, Any], list[Any]]:
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, mp.get_context("spawn").Pool(args.agents) as pool:
        results = pool.starmap(
            _one,
            [
                (i, args.hz, args.seconds, tmp, args.driver, args.task, rt)
                for i in range(args.agents)
            ],
        )
    lat = np.concatenate([np.asarray(r["latencies"]) for r in results]) * 1e3
    steps = sum(r["report"]["steps"] for r in results)
    overruns = sum(r["report"]["overruns"] for r in results)
    out = {
        "agents": args.agents,
        "hz": args.hz,
        "realtime_priority": rt,
        "steps": int(steps),
        "latency_p50_ms": round(float(np.percentile(lat, 50)), 3),
        "latency_p99_ms": round(float(np.percentile(lat, 99)), 3),
        "latency_max_ms": round(float(lat.max()), 3),
        "overruns": int(overruns),
        "overrun_ratio": round(overruns / max(steps, 1), 5),
        "loop_hz_mean": round(float(np.mean([r["report"]["loop_hz"] for r in results])), 3),
        "wall_s": round(time.monotonic() - t0, 1),
    }
    return out, results


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
