"""Resident memory of a buffer against its budget, measured in a fresh process.

Run as ``python -m buffer.bench.memory_probe`` (``robofleet bench buffer`` does, in a subprocess, so
nothing else the bench allocated is counted). It fills a buffer with a ``--budget-mib`` memory
budget from 4 robots in 64-step appends of 64x64x3 camera frames (``--image``), a 32-d state
and a 7-d action, in ``--episode``-step episodes, and at each multiple of the budget's worth
of payload (``--multiples``) records the process's resident memory (``VmRSS``) above what it
was before the buffer opened, minus the budget: what the buffer holds outside its budget.
Then it samples ``--samples`` batches of 256 (uniform) and records the peak (``VmHWM``).

The buffer's promise (``buffer/__init__``): payload memory stays inside the budget however much
data the directory holds; outside it only the row index grows (85 bytes per row) plus a small
cost per sealed segment.

Prints one JSON object: ``budget``, ``row_bytes``, and per multiple ``rows``, ``data``,
``above_budget`` (bytes) and ``above_budget_per_row``; ``peak_above_budget`` after sampling.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from buffer.config import BufferSettings
from buffer.sampling.samplers import UniformSampler
from buffer.table.replay_buffer import ReplayBuffer
from buffer.table.schema import StepSchema
from foundation.clitext import plain_text

ROBOTS = 4
CHUNK = 64


def proc_status(field: str) -> int:
    """A ``/proc/self/status`` memory field (``VmRSS``, ``VmHWM``...), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def schema_for(image: int) -> StepSchema:
    return StepSchema.from_features(
        {
            "observation.state": {"dtype": "float32", "shape": (32,)},
            "observation.images.front": {"dtype": "image", "shape": (image, image, 3)},
        },
        {"action": {"dtype": "float32", "shape": (7,)}},
    )


def make_batch(
    robot: str, seq0: int, frames: np.ndarray, episode: int, rng: np.random.Generator
) -> pa.RecordBatch:
    """``CHUNK`` steps of ``robot`` from ``seq0``; done steps carry their final observation."""
    n = len(frames)
    seq = np.arange(seq0, seq0 + n, dtype=np.int64)
    frame = seq % episode
    done = frame == episode - 1
    state = rng.standard_normal((n, 32), dtype=np.float32)
    return pa.RecordBatch.from_pydict(
        {
            "seq": seq,
            "robot_id": [robot] * n,
            "run_id": ["memory"] * n,
            "task": ["reach-v3"] * n,
            "episode_index": seq // episode,
            "frame_index": frame,
            "timestamp": frame / 20.0,
            "reward": np.zeros(n, np.float32),
            "terminated": done,
            "truncated": np.zeros(n, bool),
            "is_intervention": np.zeros(n, bool),
            "policy_version": np.zeros(n, np.int64),
            "observation.state": pa.FixedSizeListArray.from_arrays(pa.array(state.ravel()), 32),
            "observation.images.front": pa.FixedSizeListArray.from_arrays(
                pa.array(frames.ravel()), frames.shape[1]
            ),
            "action": pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(n * 7, np.float32)), 7),
            "next.observation.state": pa.array(
                [state[i].tobytes() if d else None for i, d in enumerate(done)],
                type=pa.large_binary(),
            ),
            "next.observation.images.front": pa.array(
                [frames[i].tobytes() if d else None for i, d in enumerate(done)],
                type=pa.large_binary(),
            ),
        }
    )


def measure(
    budget: int, image: int, episode: int, multiples: list[int], samples: int
) -> dict[str, Any]:
    """Fill and sample a fresh buffer (see the module docstring)."""
    schema = schema_for(image)
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, size=(CHUNK, image * image * 3), dtype=np.uint8)
    schema.validate(make_batch("warm-up", 0, frames, episode, rng)).serialize()  # lazy imports
    out: dict[str, Any] = {"budget": budget, "row_bytes": schema.fixed_row_bytes, "points": []}
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as d:
        gc.collect()
        base = proc_status("VmRSS")
        settings = BufferSettings(memory_budget_bytes=budget, prefetch=False)
        buf = ReplayBuffer.open(d, schema, settings)
        seqs = dict.fromkeys((f"robot-{i}" for i in range(ROBOTS)), 0)
        rows = 0
        todo = sorted(multiples)
        while todo:
            for robot in seqs:
                buf.append(make_batch(robot, seqs[robot], frames, episode, rng))
                seqs[robot] += CHUNK
                rows += CHUNK
            if rows * schema.fixed_row_bytes >= todo[0] * budget:
                buf.flush()
                gc.collect()
                rss = proc_status("VmRSS") - base
                above = rss - budget
                out["points"].append(
                    {
                        "multiple": todo.pop(0),
                        "rows": rows,
                        "data": rows * schema.fixed_row_bytes,
                        "above_budget": above,
                        "above_budget_per_row": above / rows,
                        "bytes_in_cache": buf.stats()["bytes_in_cache"],
                        "resident": rss,
                    }
                )
        sampler = UniformSampler()
        for _ in range(samples):
            buf.sample(256, sampler, rng=rng)
        out["peak_above_budget"] = proc_status("VmHWM") - base - budget
        out["index_bytes_per_row"] = sum(a.itemsize for a in buf.index.cols.values()) + 8
        buf.close()
    return out


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m buffer.bench.memory_probe", description=plain_text(__doc__)
    )
    parser.add_argument("--budget-mib", type=float, default=16.0)
    parser.add_argument("--image", type=int, default=64, help="square camera frame side (px)")
    parser.add_argument("--episode", type=int, default=2000, help="steps per episode")
    parser.add_argument("--multiples", default="2,10,20", help="budgets' worth of data")
    parser.add_argument("--samples", type=int, default=200, help="batches of 256 afterwards")
    args = parser.parse_args(list(argv))
    multiples = [int(x) for x in args.multiples.split(",")]
    budget = int(args.budget_mib * 2**20)
    print(json.dumps(measure(budget, args.image, args.episode, multiples, args.samples)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
