"""Durable ingest against raw Arrow IPC + fsync of the same batches (``robofleet bench buffer``).

Each writer thread is one robot appending its batches: ``ReplayBuffer.append`` (validated,
WAL, group commit, acknowledged after fdatasync) against a raw ``pyarrow`` IPC stream writer
per thread with an fsync per batch, in alternating rounds.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from buffer.bench.data import payload_bytes
from buffer.config import BufferSettings
from buffer.table.ack_phases import PHASES
from buffer.table.replay_buffer import ReplayBuffer
from buffer.table.schema import StepSchema

HOT = BufferSettings(memory_budget_bytes=8 * 1024**3, prefetch=False)  # everything stays hot


def run_threads(fns: list[Any]) -> float:
    """Run ``fns`` in one thread each; wall seconds until the last one ends."""
    threads = [threading.Thread(target=f) for f in fns]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def bench_ingest(
    schema: StepSchema, per_writer: list[list[pa.RecordBatch]], root: Path, rounds: int = 3
) -> dict[str, float]:
    """Durable ingest against raw Arrow IPC + fsync, in ``rounds`` alternating pairs.

    The disk's speed swings with what else runs on the machine, so one pair of timings says
    little: each round times both sides back to back (alternating which goes first), the
    ratio reported is the median of the per-round ratios, and the CPU seconds each side took
    (``time.process_time``: this process, all threads) are reported next to the wall time.
    """
    n = sum(b.num_rows for bs in per_writer for b in bs)
    mb = payload_bytes(per_writer) / 1e6
    lat: list[float] = []
    fsyncs_per_batch: list[float] = []
    phases: list[dict[str, float]] = []

    def ours(k: int) -> tuple[float, float]:
        wall, cpu, mine, stats = _ours_round(schema, per_writer, root / f"ingest-{k}", n)
        lat.extend(mine)
        fsyncs_per_batch.append(stats["wal_fsyncs"] / max(len(mine), 1))
        phases.append({p: float(stats[f"ack_{p}_ms"]) for p in PHASES})
        return wall, cpu

    ours_t: list[tuple[float, float]] = []
    raw_t: list[tuple[float, float]] = []
    for k in range(rounds):
        if k % 2 == 0:
            raw_t.append(_raw_round(per_writer, root / f"arrow-{k}"))
            ours_t.append(ours(k))
        else:
            ours_t.append(ours(k))
            raw_t.append(_raw_round(per_writer, root / f"arrow-{k}"))
    ratios = [r[0] / o[0] for o, r in zip(ours_t, raw_t, strict=True)]
    i = int(np.argsort(ratios)[len(ratios) // 2])  # the median round
    return {
        "ingest_records_per_s": n / ours_t[i][0],
        "arrow_records_per_s": n / raw_t[i][0],
        "ingest_ratio_median": float(ratios[i]),
        "ingest_ratio_min": float(min(ratios)),
        "ingest_ratio_max": float(max(ratios)),
        "ingest_cpu_s": float(np.median([c for _, c in ours_t])),
        "arrow_cpu_s": float(np.median([c for _, c in raw_t])),
        "ingest_mb_per_s": mb / ours_t[i][0],
        "arrow_mb_per_s": mb / raw_t[i][0],
        "ack_p50_ms": float(np.percentile(lat, 50) * 1e3),
        "ack_p99_ms": float(np.percentile(lat, 99) * 1e3),
        "fsyncs_per_batch": float(np.median(fsyncs_per_batch)),
        # where an append's latency went (``buffer.table.ack_phases``), median over the rounds
        **{f"ack_{p}_ms": float(np.median([ph[p] for ph in phases])) for p in PHASES},
    }


def _raw_round(per_writer: list[list[pa.RecordBatch]], base_dir: Path) -> tuple[float, float]:
    """The baseline: one Arrow IPC stream per writer, an fsync per batch; (wall, CPU) s."""
    base_dir.mkdir()

    def raw(i: int, batches: list[pa.RecordBatch]) -> None:
        with open(base_dir / f"w{i}.arrows", "wb") as f:
            with ipc.new_stream(f, batches[0].schema) as w:
                for b in batches:
                    w.write_batch(b)
                    f.flush()
                    os.fsync(f.fileno())

    c0 = time.process_time()
    wall = run_threads([lambda i=i, bs=bs: raw(i, bs) for i, bs in enumerate(per_writer)])
    cpu = time.process_time() - c0
    shutil.rmtree(base_dir)
    return wall, cpu


def _ours_round(
    schema: StepSchema, per_writer: list[list[pa.RecordBatch]], directory: Path, n: int
) -> tuple[float, float, list[float], dict[str, float | int]]:
    """``ReplayBuffer.append`` from one thread per writer: (wall s, CPU s, ack latencies s,
    the buffer's ``stats()`` after the appends).

    Raises:
        RuntimeError: the buffer stored other than ``n`` records.
    """
    buf = ReplayBuffer.open(directory, schema, HOT)
    mine_all: list[float] = []
    lock = threading.Lock()

    def ours(batches: list[pa.RecordBatch]) -> None:
        mine = []
        for b in batches:
            t = time.perf_counter()
            buf.append(b)
            mine.append(time.perf_counter() - t)
        with lock:
            mine_all.extend(mine)

    c0 = time.process_time()
    wall = run_threads([lambda bs=bs: ours(bs) for bs in per_writer])
    cpu = time.process_time() - c0
    buf.flush()
    stored = buf.num_steps
    stats = buf.stats()
    buf.close()
    shutil.rmtree(directory)
    if stored != n:
        raise RuntimeError(f"ingest stored {stored} of {n} records")
    return wall, cpu, mine_all, stats


def fill(buf: ReplayBuffer, per_writer: list[list[pa.RecordBatch]]) -> None:
    """Append every writer's batches (one thread each) and wait for the seals."""
    run_threads([lambda bs=bs: [buf.append(b) for b in bs] for bs in per_writer])
    buf.flush()
