"""``robofleet bench buffer``: durable ingest, sampling and memory, beside baselines.

Steps: an 84x84x3 uint8 image, a 32-d float32 state, a 7-d float32 action and the flags
(about 21 KB each), written by 8 concurrent writers in chunks of 64; and camera-sized steps
(two 128x128x3 cameras and the state, about 98 KB) in chunks of 16 (``buffer.bench.data``).

* ingest: :meth:`ReplayBuffer.append` (validated, WAL, group commit, acked after
  fdatasync) vs a raw pyarrow IPC stream writer per writer thread with an fsync per batch
  (``buffer.bench.ingest``), for both step sizes.
* hot sampling: batch-256 uniform ``sample`` vs numpy fancy-index gathers of the same columns
  and vs ``lerobot.rl.buffer.ReplayBuffer.sample``; cold sampling: the same from a buffer twice
  its memory budget (``buffer.bench.sample``); camera-sized: vs the numpy gather.
* memory: resident memory above a 16 MiB budget at 2x, 10x and 20x its worth of 64x64x3
  steps in 2,000-step episodes, in a fresh process (``buffer.bench.memory_probe``).
* ``--shards N``: ingest with 1 and N shards, each shard its own process
  (``buffer.bench.shards``).
* ``--learner-view``: camera batches of 256 drawn by a learner from 1, 2 and 4 shard actors
  while robots write, at full speed and at ``--learner-hz``, against the numpy gather
  (``buffer.bench.learner_view``).

Prints a rich table, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from buffer.bench.data import ROBOT_CAMERAS, bench_schema, writer_batches
from buffer.bench.ingest import bench_ingest
from buffer.bench.learner_view import add_arguments, bench_learner_view, config_from
from buffer.bench.sample import BATCH, bench_cold, bench_sampling
from foundation.clitext import plain_text

WRITERS = 8
CHUNK = 64
CAMERA_CHUNK = 16  # 16 camera-sized steps: ~1.6 MB per append, about a second of a robot


def bench_camera(root: Path, chunks: int, seconds: float, rounds: int) -> dict[str, float]:
    """Ingest and hot sampling of camera-sized steps (keys prefixed ``camera_``)."""
    schema = bench_schema(ROBOT_CAMERAS)
    per_writer = writer_batches(schema, WRITERS, chunks, CAMERA_CHUNK, seed=7)
    ingest = bench_ingest(schema, per_writer, root, rounds=rounds)
    sampling = bench_sampling(schema, per_writer, root, seconds, lerobot=False)
    out = {f"camera_{k}": v for k, v in {**ingest, **sampling}.items()}
    out["camera_step_kb"] = schema.fixed_row_bytes / 1e3
    out["camera_records"] = float(WRITERS * chunks * CAMERA_CHUNK)
    return out


def bench_memory(quick: bool) -> dict[str, float]:
    """``python -m buffer.bench.memory_probe`` in a fresh process (nothing of this one counted)."""
    args = ["--budget-mib", "16", "--multiples", "2,10,20", "--samples", "100"]
    if quick:
        args = ["--budget-mib", "8", "--multiples", "2,10,20", "--samples", "50"]
    out = subprocess.run(
        [sys.executable, "-m", "buffer.bench.memory_probe", *args],
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    )
    r = json.loads(out.stdout.strip().splitlines()[-1])
    res = {"memory_budget_mb": r["budget"] / 2**20, "index_bytes_per_row": r["index_bytes_per_row"]}
    for p in r["points"]:
        m = p["multiple"]
        res[f"mem_{m}x_above_budget_mb"] = p["above_budget"] / 2**20
        res[f"mem_{m}x_above_budget_per_row"] = p["above_budget_per_row"]
        res[f"mem_{m}x_rows"] = p["rows"]
    res["mem_peak_above_budget_mb"] = r["peak_above_budget"] / 2**20
    return res


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="robofleet bench buffer", description=plain_text(__doc__))
    parser.add_argument("--config", default=None, help="robofleet settings file")
    parser.add_argument("--quick", action="store_true", help="smaller run (a few minutes)")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    parser.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument(
        "--rounds", type=int, default=3, help="alternating ingest rounds (median ratio reported)"
    )
    parser.add_argument(
        "--shards", type=int, default=0, help="also ingest with 1 and this many shard processes"
    )
    parser.add_argument(
        "--learner-view",
        action="store_true",
        help="also the learner's view: batches from 1, 2 and 4 shard actors while robots write",
    )
    add_arguments(parser)
    args = parser.parse_args(list(argv))
    chunks = 8 if args.quick else 24
    seconds = 1.5 if args.quick else 4.0
    schema = bench_schema()
    per_writer = writer_batches(schema, WRITERS, chunks, CHUNK)
    root = Path(tempfile.mkdtemp(prefix="bench-buffer-", dir=args.dir))
    try:
        r: dict[str, float] = {}
        r.update(bench_ingest(schema, per_writer, root, rounds=args.rounds))
        r.update(bench_sampling(schema, per_writer, root, seconds))
        r.update(bench_cold(schema, per_writer, root, seconds))
        del per_writer
        r.update(bench_camera(root, 4 if args.quick else 12, seconds, args.rounds))
        r.update(bench_memory(args.quick))
        if args.shards > 1:
            from buffer.bench.shards import bench_shards

            r.update(bench_shards(root, args.shards, WRITERS, chunks, rounds=args.rounds))
        if args.learner_view:
            r.update(bench_learner_view(root / "learner", config_from(args, args.quick)))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result = _result(r, chunks)
    if not args.json:
        from buffer.bench.report import print_table

        print_table(r, result)
    sys.stdout.flush()
    print(json.dumps(result))
    return 0


def _result(r: dict[str, float], chunks: int) -> dict[str, Any]:
    """The JSON line: the ratios first (rounded), then every figure."""
    ratios = {
        "ingest_ratio_vs_arrow": r["ingest_ratio_median"],
        "ingest_cpu_ratio_vs_arrow": r["arrow_cpu_s"] / r["ingest_cpu_s"],
        "sample_ratio_vs_gather": r["gather_sample_ms"] / r["hot_sample_ms"],
        "sample_ratio_vs_lerobot": r["lerobot_sample_ms"] / r["hot_sample_ms"],
        "cold_ratio_vs_hot": r["hot_sample_ms"] / r["cold_sample_ms"],
        "camera_ingest_ratio_vs_arrow": r["camera_ingest_ratio_median"],
        "camera_sample_ratio_vs_gather": r["camera_gather_sample_ms"] / r["camera_hot_sample_ms"],
    }
    if "shards_speedup" in r:
        ratios["shards_ingest_ratio_vs_one"] = r["shards_speedup"]
    return {
        "records": WRITERS * chunks * CHUNK,
        "writers": WRITERS,
        "chunk": CHUNK,
        "batch": BATCH,
        **{k: round(v, 3) for k, v in ratios.items()},
        **{k: round(v, 4) for k, v in r.items()},
    }


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
