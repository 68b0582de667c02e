"""Run in a fresh process: fill a buffer to twice its memory budget, sample, report RSS growth.

Prints one JSON line: budget, data bytes, baseline RSS, peak RSS (VmHWM) and final RSS, all
in bytes, plus the hit rate and how many cold pages were released.
"""

from __future__ import annotations

import json
import sys
import tempfile

import numpy as np

from buffer import BufferSettings, CacheAwareSampler, ReplayBuffer, StepSchema, UniformSampler


def rss(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def make(schema: StepSchema, seq0: int, n: int, robot: str) -> list[dict]:
    out = []
    for seq in range(seq0, seq0 + n):
        f = seq % 100
        done = f == 99
        r = {
            "seq": seq,
            "robot_id": robot,
            "run_id": "mem",
            "task": "t",
            "episode_index": seq // 100,
            "frame_index": f,
            "timestamp": f / 10,
            "reward": 0.0,
            "terminated": done,
            "truncated": False,
            "is_intervention": False,
            "policy_version": 0,
            "observation.state": np.full(32, seq, np.float32),
            "observation.images.front": np.full((84, 84, 3), seq % 256, np.uint8),
            "action": np.zeros(7, np.float32),
        }
        if done:
            r["next.observation.state"] = np.zeros(32, np.float32)
            r["next.observation.images.front"] = np.zeros((84, 84, 3), np.uint8)
        out.append(r)
    return out


def main() -> None:
    budget = int(sys.argv[1])
    schema = StepSchema.from_features(
        {
            "observation.state": {"dtype": "float32", "shape": (32,)},
            "observation.images.front": {"dtype": "image", "shape": (84, 84, 3)},
        },
        {"action": {"dtype": "float32", "shape": (7,)}},
    )
    # Warm up lazy imports and allocator pools before the baseline.
    schema.validate(schema.batch_from_records(make(schema, 0, 64, "warm"))).serialize()
    target = 2 * budget
    with tempfile.TemporaryDirectory() as d:
        base = rss("VmRSS")
        settings = BufferSettings(
            memory_budget_bytes=budget,
            segment_target_bytes=budget // 8,
            prefetch=len(sys.argv) < 3,
            prefetch_interval_s=0.01,
        )
        buf = ReplayBuffer.open(d, schema, settings)
        seq = 0
        while seq * schema.fixed_row_bytes < target:
            buf.append(make(schema, seq, 64, "r"))
            seq += 64
        buf.flush()
        peak_fill = rss("VmHWM")
        rng = np.random.default_rng(0)
        for i in range(300):
            sampler = UniformSampler() if i % 2 else CacheAwareSampler(0.5)
            b = buf.sample(32, sampler, rng=rng)
            assert (b["observation.state"][:, 0] == b["index"]).all()  # right rows, cold or hot
        stats = buf.stats()
        print(
            json.dumps(
                {
                    "budget": budget,
                    "data": seq * schema.fixed_row_bytes,
                    "base": base,
                    "peak": rss("VmHWM"),
                    "peak_fill": peak_fill,
                    "final": rss("VmRSS"),
                    "hit_rate": stats["cache_hit_rate"],
                    "page_releases": buf.storage.page_releases,
                    "promotions": buf.storage.promotions,
                    "bytes_in_cache": stats["bytes_in_cache"],
                }
            )
        )
        buf.close()


if __name__ == "__main__":
    main()
