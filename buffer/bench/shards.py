"""Ingest with 1 and N buffer shards, each shard in its own process (``bench buffer --shards``).

The same robots' batches go into one buffer (one process) or into N shards, robots hashed to
shards (``buffer.service.shards.shard_of``), each shard a whole buffer in its own process, as a Ray
actor per shard would run them (``buffer.service.shard_actor``). Every process makes its robots'
batches, waits at a barrier, then appends them from one thread per robot; the figure is all
records over the time from the first start to the last end.
"""

from __future__ import annotations

import multiprocessing as mp
import shutil
import time
from pathlib import Path
from typing import Any

from buffer.bench.data import bench_schema, make_batches
from buffer.bench.ingest import HOT, run_threads
from buffer.service.shards import shard_dir, shard_of
from buffer.table.replay_buffer import ReplayBuffer


def _shard_worker(
    root: str,
    k: int,
    shards: int,
    robots: list[str],
    chunks: int,
    cameras: dict[str, tuple[int, int, int]] | None,
    chunk: int,
    barrier: Any,
    results: Any,
) -> None:
    """One shard's process: its robots' batches, appended after the barrier."""
    import numpy as np

    schema = bench_schema(cameras)
    per_robot = [
        make_batches(schema, r, chunks, np.random.default_rng(i), chunk)
        for i, r in enumerate(robots)
    ]
    buf = ReplayBuffer.open(shard_dir(root, k), schema, HOT)
    barrier.wait()
    t0 = time.time()
    run_threads([lambda bs=bs: [buf.append(b) for b in bs] for bs in per_robot])
    t1 = time.time()
    stored = buf.num_steps
    buf.close()
    results.put((k, t0, t1, stored))


def measure(
    root: Path,
    shards: int,
    robots: int,
    chunks: int,
    chunk: int = 64,
    cameras: dict[str, tuple[int, int, int]] | None = None,
) -> dict[str, float]:
    """Records per second of ``robots`` robots into ``shards`` shard processes.

    Raises:
        RuntimeError: a shard process failed or stored another number of records.
    """
    names = [f"robot-{i}" for i in range(robots)]
    groups = {k: [r for r in names if shard_of(r, shards) == k] for k in range(shards)}
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len([g for g in groups.values() if g]))
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=_shard_worker,
            args=(str(root), k, shards, g, chunks, cameras, chunk, barrier, results),
        )
        for k, g in groups.items()
        if g
    ]
    for p in procs:
        p.start()
    got = [results.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(60)
        if p.exitcode != 0:
            raise RuntimeError(f"shard process exited with {p.exitcode}")
    shutil.rmtree(root, ignore_errors=True)
    total = sum(g[3] for g in got)
    if total != robots * chunks * chunk:
        raise RuntimeError(f"shards stored {total} of {robots * chunks * chunk} records")
    wall = max(g[2] for g in got) - min(g[1] for g in got)
    return {"records_per_s": total / wall, "wall_s": wall, "processes": float(len(procs))}


def bench_shards(
    root: Path, shards: int, robots: int, chunks: int, rounds: int = 3
) -> dict[str, float]:
    """1 shard against ``shards`` shards, alternating, ``rounds`` times: the median ratio."""
    one: list[float] = []
    many: list[float] = []
    for i in range(rounds):
        order = (1, shards) if i % 2 == 0 else (shards, 1)
        for n in order:
            r = measure(root / f"shards-{n}-{i}", n, robots, chunks)
            (one if n == 1 else many).append(r["records_per_s"])
    ratios = sorted(m / o for o, m in zip(one, many, strict=True))
    return {
        "shards": float(shards),
        "shard1_records_per_s": float(sorted(one)[len(one) // 2]),
        "shardN_records_per_s": float(sorted(many)[len(many) // 2]),
        "shards_speedup": float(ratios[len(ratios) // 2]),
    }
