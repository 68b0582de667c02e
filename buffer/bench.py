"""``robofleet bench buffer``: durable ingest and sampling, side by side with baselines.

Records: an 84x84x3 uint8 image, a 32-d float32 state, a 7-d float32 action and the flags
(about 21 KB each), written by 8 concurrent writers in chunks of 64.

* ingest: :meth:`ReplayBuffer.append` (validated, WAL, group commit, acked after
  fdatasync) vs a raw pyarrow IPC stream writer per writer thread with an fsync per batch.
* hot sampling: batch-256 uniform ``sample`` (with next observations and flags) vs numpy
  fancy-index gather of the same columns (and ``idx + 1`` for next observations) from
  contiguous arrays, and vs ``lerobot.rl.buffer.ReplayBuffer.sample`` (CPU, no augmentation).
* cold sampling: the same, from a buffer twice the size of its memory budget.

Prints a rich table, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from buffer.config import BufferSettings
from buffer.replay_buffer import ReplayBuffer
from buffer.samplers import UniformSampler
from buffer.schema import StepSchema

WRITERS = 8
CHUNK = 64
BATCH = 256
IMAGE = (84, 84, 3)


def bench_schema() -> StepSchema:
    return StepSchema.from_features(
        {
            "observation.state": {"dtype": "float32", "shape": (32,)},
            "observation.images.front": {"dtype": "image", "shape": IMAGE},
        },
        {"action": {"dtype": "float32", "shape": (7,)}},
    )


def make_batches(
    schema: StepSchema, robot: str, chunks: int, rng: np.random.Generator, episode_len: int = 200
) -> list[pa.RecordBatch]:
    """``chunks`` record batches of ``CHUNK`` steps of one robot, episodes of ``episode_len``."""
    out = []
    n = chunks * CHUNK
    seq = np.arange(n, dtype=np.int64)
    frame = seq % episode_len
    done = frame == episode_len - 1
    img_n = int(np.prod(IMAGE))
    images = rng.integers(0, 256, size=(n, img_n), dtype=np.uint8)
    state = rng.standard_normal((n, 32), dtype=np.float32)
    action = rng.standard_normal((n, 7), dtype=np.float32)
    for c in range(chunks):
        s = slice(c * CHUNK, (c + 1) * CHUNK)
        d = done[s]
        finals: list[bytes | None] = [
            images[i].tobytes() if d[k] else None for k, i in enumerate(range(s.start, s.stop))
        ]
        finals_state: list[bytes | None] = [
            state[i].tobytes() if d[k] else None for k, i in enumerate(range(s.start, s.stop))
        ]
        cols = {
            "seq": pa.array(seq[s]),
            "robot_id": pa.array([robot] * CHUNK),
            "run_id": pa.array(["bench"] * CHUNK),
            "task": pa.array(["reach-v3"] * CHUNK),
            "episode_index": pa.array(seq[s] // episode_len),
            "frame_index": pa.array(frame[s]),
            "timestamp": pa.array(frame[s] / 10.0),
            "reward": pa.array(rng.random(CHUNK, dtype=np.float32)),
            "terminated": pa.array(d),
            "truncated": pa.array(np.zeros(CHUNK, dtype=bool)),
            "is_intervention": pa.array(rng.random(CHUNK) < 0.1),
            "policy_version": pa.array(np.zeros(CHUNK, dtype=np.int64)),
            "observation.state": pa.FixedSizeListArray.from_arrays(
                pa.array(state[s].reshape(-1)), 32
            ),
            "observation.images.front": pa.FixedSizeListArray.from_arrays(
                pa.array(images[s].reshape(-1)), img_n
            ),
            "action": pa.FixedSizeListArray.from_arrays(pa.array(action[s].reshape(-1)), 7),
            "next.observation.state": pa.array(finals_state, type=pa.large_binary()),
            "next.observation.images.front": pa.array(finals, type=pa.large_binary()),
        }
        out.append(pa.RecordBatch.from_pydict(cols))
    return out


def _run_threads(fns: list[Any]) -> float:
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
    lat: list[float] = []
    fsyncs_per_batch: list[float] = []

    def ours(k: int) -> tuple[float, float]:
        wall, cpu, mine, fsyncs = _ours_round(schema, per_writer, root / f"ingest-{k}", n)
        lat.extend(mine)
        fsyncs_per_batch.append(fsyncs)
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
        "ingest_mb_per_s": n * 21.3e-3 / ours_t[i][0],
        "ack_p50_ms": float(np.percentile(lat, 50) * 1e3),
        "ack_p99_ms": float(np.percentile(lat, 99) * 1e3),
        "fsyncs_per_batch": float(np.median(fsyncs_per_batch)),
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
    wall = _run_threads([lambda i=i, bs=bs: raw(i, bs) for i, bs in enumerate(per_writer)])
    cpu = time.process_time() - c0
    shutil.rmtree(base_dir)
    return wall, cpu


def _ours_round(
    schema: StepSchema, per_writer: list[list[pa.RecordBatch]], directory: Path, n: int
) -> tuple[float, float, list[float], float]:
    """``ReplayBuffer.append`` from one thread per writer: (wall s, CPU s, ack latencies s,
    fdatasyncs per appended batch).

    Raises:
        RuntimeError: the buffer stored other than ``n`` records.
    """
    buf = ReplayBuffer.open(
        directory, schema, BufferSettings(memory_budget_bytes=8 * 1024**3, prefetch=False)
    )
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
    wall = _run_threads([lambda bs=bs: ours(bs) for bs in per_writer])
    cpu = time.process_time() - c0
    buf.flush()
    stored = buf.num_steps
    fsyncs = buf.stats()["wal_fsyncs"] / max(len(mine_all), 1)
    buf.close()
    shutil.rmtree(directory)
    if stored != n:
        raise RuntimeError(f"ingest stored {stored} of {n} records")
    return wall, cpu, mine_all, fsyncs


def _time_calls(fn: Any, seconds: float, min_calls: int = 5) -> float:
    """Median seconds per call over about ``seconds`` of calls."""
    fn()
    times: list[float] = []
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end or len(times) < min_calls:
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def fill(buf: ReplayBuffer, per_writer: list[list[pa.RecordBatch]]) -> None:
    _run_threads([lambda bs=bs: [buf.append(b) for b in bs] for bs in per_writer])
    buf.flush()


def bench_sampling(
    schema: StepSchema, per_writer: list[list[pa.RecordBatch]], root: Path, seconds: float
) -> dict[str, float]:
    n = sum(b.num_rows for bs in per_writer for b in bs)
    buf = ReplayBuffer.open(
        root / "hot", schema, BufferSettings(memory_budget_bytes=8 * 1024**3, prefetch=False)
    )
    fill(buf, per_writer)
    rng = np.random.default_rng(0)
    sampler = UniformSampler()
    t_ours = _time_calls(lambda: buf.sample(BATCH, sampler, rng=rng), seconds)
    hit = buf.stats()["cache_hit_rate"]
    # numpy baseline: the same columns as contiguous arrays, next observation at idx + 1.
    table = pa.Table.from_batches([b for bs in per_writer for b in bs])
    arrays = {
        "observation.state": table["observation.state"]
        .combine_chunks()
        .flatten()
        .to_numpy()
        .reshape(n, 32),
        "observation.images.front": table["observation.images.front"]
        .combine_chunks()
        .flatten()
        .to_numpy()
        .reshape(n, *IMAGE),
        "action": table["action"].combine_chunks().flatten().to_numpy().reshape(n, 7),
    }
    scalars = {
        k: table[k].to_numpy()
        for k in ("reward", "terminated", "truncated", "is_intervention", "policy_version")
    }
    del table

    def gather() -> dict[str, np.ndarray]:
        idx = rng.integers(0, n - 1, size=BATCH)
        out = {k: v[idx] for k, v in arrays.items()}
        out["next.observation.state"] = arrays["observation.state"][idx + 1]
        out["next.observation.images.front"] = arrays["observation.images.front"][idx + 1]
        for k, v in scalars.items():
            out[k] = v[idx]
        return out

    t_gather = _time_calls(gather, seconds)
    buf.close()
    shutil.rmtree(root / "hot")
    t_lerobot = bench_lerobot(arrays, scalars, min(n, 6000), seconds)
    return {
        "hot_sample_ms": t_ours * 1e3,
        "gather_sample_ms": t_gather * 1e3,
        "lerobot_sample_ms": t_lerobot * 1e3,
        "hot_hit_rate": hit,
    }


def bench_lerobot(
    arrays: dict[str, np.ndarray], scalars: dict[str, np.ndarray], n: int, seconds: float
) -> float:
    import torch
    from lerobot.rl.buffer import ReplayBuffer as LeRobotReplayBuffer

    torch.set_num_threads(2)
    rb = LeRobotReplayBuffer(
        capacity=n,
        device="cpu",
        storage_device="cpu",
        state_keys=["observation.state", "observation.images.front"],
        use_drq=False,
        optimize_memory=True,
    )
    with warnings.catch_warnings():  # read-only Arrow-backed arrays; torch only reads them
        warnings.simplefilter("ignore", UserWarning)
        state_t = torch.from_numpy(arrays["observation.state"][: n + 1])
        img_t = torch.from_numpy(arrays["observation.images.front"][: n + 1])
        act_t = torch.from_numpy(arrays["action"][:n])
    for i in range(n):
        rb.add(
            state={
                "observation.state": state_t[i : i + 1],
                "observation.images.front": img_t[i : i + 1],
            },
            action=act_t[i : i + 1],
            reward=float(scalars["reward"][i]),
            next_state={
                "observation.state": state_t[i + 1 : i + 2],
                "observation.images.front": img_t[i + 1 : i + 2],
            },
            done=bool(scalars["terminated"][i]),
            truncated=bool(scalars["truncated"][i]),
        )
    return _time_calls(lambda: rb.sample(BATCH), seconds)


def bench_cold(
    schema: StepSchema, per_writer: list[list[pa.RecordBatch]], root: Path, seconds: float
) -> dict[str, float]:
    n = sum(b.num_rows for bs in per_writer for b in bs)
    data_bytes = n * schema.fixed_row_bytes
    budget = data_bytes // 2
    settings = BufferSettings(
        memory_budget_bytes=budget, segment_target_bytes=max(budget // 16, 1 << 20)
    )
    buf = ReplayBuffer.open(root / "cold", schema, settings)
    fill(buf, per_writer)
    rng = np.random.default_rng(1)
    sampler = UniformSampler()
    t_cold = _time_calls(lambda: buf.sample(BATCH, sampler, rng=rng), seconds)
    st = buf.stats()
    buf.close()
    shutil.rmtree(root / "cold")
    return {
        "cold_sample_ms": t_cold * 1e3,
        "cold_hit_rate": float(st["cache_hit_rate"]),
        "cold_budget_mb": budget / 2**20,
        "cold_cache_mb": float(st["bytes_in_cache"]) / 2**20,
        "data_mb": data_bytes / 2**20,
    }


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="robofleet bench buffer", description=__doc__)
    parser.add_argument("--config", default=None, help="robofleet settings file")
    parser.add_argument("--quick", action="store_true", help="smaller run (under a minute)")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    parser.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument(
        "--rounds", type=int, default=3, help="alternating ingest rounds (median ratio reported)"
    )
    args = parser.parse_args(list(argv))
    chunks = 8 if args.quick else 24
    seconds = 1.5 if args.quick else 4.0
    schema = bench_schema()
    rng = np.random.default_rng(42)
    per_writer = [make_batches(schema, f"robot-{i}", chunks, rng) for i in range(WRITERS)]
    root = Path(tempfile.mkdtemp(prefix="bench-buffer-", dir=args.dir))
    try:
        r: dict[str, float] = {}
        r.update(bench_ingest(schema, per_writer, root, rounds=args.rounds))
        r.update(bench_sampling(schema, per_writer, root, seconds))
        r.update(bench_cold(schema, per_writer, root, seconds))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result: dict[str, Any] = {
        "records": WRITERS * chunks * CHUNK,
        "writers": WRITERS,
        "chunk": CHUNK,
        "batch": BATCH,
        "ingest_ratio_vs_arrow": r["ingest_ratio_median"],
        "ingest_cpu_ratio_vs_arrow": r["arrow_cpu_s"] / r["ingest_cpu_s"],
        "sample_ratio_vs_gather": r["gather_sample_ms"] / r["hot_sample_ms"],
        "sample_ratio_vs_lerobot": r["lerobot_sample_ms"] / r["hot_sample_ms"],
        "cold_ratio_vs_hot": r["hot_sample_ms"] / r["cold_sample_ms"],
        **{k: round(v, 4) for k, v in r.items()},
    }
    for k in (
        "ingest_ratio_vs_arrow",
        "ingest_cpu_ratio_vs_arrow",
        "sample_ratio_vs_gather",
        "sample_ratio_vs_lerobot",
        "cold_ratio_vs_hot",
    ):
        result[k] = round(result[k], 3)
    if not args.json:
        _print_table(r, result)
    sys.stdout.flush()
    print(json.dumps(result))
    return 0


def _print_table(r: dict[str, float], result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"bench buffer: {result['records']} records of ~21 KB, 8 writers x 64")
    t.add_column("measure")
    t.add_column("robofleet buffer", justify="right")
    t.add_column("baseline", justify="right")
    t.add_column("ratio", justify="right")
    t.add_column("target", justify="right")
    t.add_row(
        "durable ingest (records/s) vs raw Arrow IPC + fsync",
        f"{r['ingest_records_per_s']:,.0f}",
        f"{r['arrow_records_per_s']:,.0f}",
        f"{result['ingest_ratio_vs_arrow']:.2f}",
        ">= 0.5",
    )
    t.add_row(
        "  ingest ratio per round: min / median / max",
        "",
        "",
        f"{r['ingest_ratio_min']:.2f} / {r['ingest_ratio_median']:.2f} / "
        f"{r['ingest_ratio_max']:.2f}",
        "",
    )
    t.add_row(
        "  ingest CPU seconds (all threads) vs Arrow",
        f"{r['ingest_cpu_s']:.2f}",
        f"{r['arrow_cpu_s']:.2f}",
        f"{result['ingest_cpu_ratio_vs_arrow']:.2f}",
        "",
    )
    t.add_row(
        "hot sample, batch 256 (ms) vs numpy gather",
        f"{r['hot_sample_ms']:.2f}",
        f"{r['gather_sample_ms']:.2f}",
        f"{result['sample_ratio_vs_gather']:.2f}",
        ">= 0.5",
    )
    t.add_row(
        "hot sample, batch 256 (ms) vs lerobot ReplayBuffer",
        f"{r['hot_sample_ms']:.2f}",
        f"{r['lerobot_sample_ms']:.2f}",
        f"{result['sample_ratio_vs_lerobot']:.2f}",
        ">= 1.5",
    )
    t.add_row(
        f"cold sample (ms), data {r['data_mb']:.0f} MB = 2x budget",
        f"{r['cold_sample_ms']:.2f}",
        f"{r['hot_sample_ms']:.2f} (hot)",
        f"{result['cold_ratio_vs_hot']:.2f}",
        "",
    )
    t.add_row("cold cache hit rate", f"{r['cold_hit_rate']:.2f}", "", "", "")
    t.add_row(
        "ack latency p50 / p99 (ms)", f"{r['ack_p50_ms']:.1f} / {r['ack_p99_ms']:.1f}", "", "", ""
    )
    t.add_row("fdatasyncs per appended batch", f"{r['fsyncs_per_batch']:.2f}", "1.00", "", "")
    Console().print(t)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
