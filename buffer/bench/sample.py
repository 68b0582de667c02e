"""Sampling from the buffer against baselines of the same rows (``robofleet bench buffer``).

* hot: batch-256 uniform ``sample`` (with next observations and flags), once sampling has
  made the prefetch thread promote every segment into RAM (:func:`warm_up`), vs a numpy
  fancy-index gather of the same columns (and ``idx + 1`` for next observations) from
  contiguous arrays, and vs ``lerobot.rl.buffer.ReplayBuffer.sample`` (CPU, no augmentation).
* cold: the same from a buffer twice the size of its memory budget.
"""

from __future__ import annotations

import shutil
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from buffer.bench.ingest import HOT, fill
from buffer.config import BufferSettings
from buffer.sampling.samplers import UniformSampler
from buffer.table.features import FINAL_PREFIX
from buffer.table.replay_buffer import ReplayBuffer
from buffer.table.schema import StepSchema

BATCH = 256
SCALARS = ("reward", "terminated", "truncated", "is_intervention", "policy_version")


def time_calls(fn: Callable[[], Any], seconds: float, min_calls: int = 5) -> float:
    """Median seconds per call over about ``seconds`` of calls."""
    fn()
    times: list[float] = []
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end or len(times) < min_calls:
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def time_pair(
    a: Callable[[], Any], b: Callable[[], Any], seconds: float, min_calls: int = 5
) -> tuple[float, float]:
    """Median seconds per call of ``a`` and of ``b``, called alternately for about
    ``seconds``: both see the same machine and the same allocator state (a batch of camera
    frames is tens of MB, and whether malloc hands out fresh pages or reused ones depends on
    what the process freed before, which swung a one-after-the-other timing by 2x)."""
    a()
    b()
    ta: list[float] = []
    tb: list[float] = []
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end or len(ta) < min_calls:
        for fn, times in ((a, ta), (b, tb)):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return float(np.median(ta)), float(np.median(tb))


def contiguous_columns(
    schema: StepSchema, per_writer: list[list[pa.RecordBatch]]
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The batches' payload columns as contiguous ``(n, *shape)`` arrays, and the scalar
    flags: what the numpy baseline gathers from."""
    table = pa.Table.from_batches([b for bs in per_writer for b in bs])
    n = table.num_rows
    arrays = {
        k: table[k].combine_chunks().flatten().to_numpy().reshape(n, *f.shape)
        for k, f in schema.payload.items()
        if k in table.column_names
    }
    scalars = {k: table[k].to_numpy() for k in SCALARS}
    return arrays, scalars


def numpy_gather(
    schema: StepSchema,
    arrays: dict[str, np.ndarray],
    scalars: dict[str, np.ndarray],
    rng: np.random.Generator,
    batch: int = BATCH,
) -> dict[str, np.ndarray]:
    """The baseline batch: ``batch`` random rows of every column, next observations at
    ``idx + 1``."""
    n = len(next(iter(scalars.values())))
    idx = rng.integers(0, n - 1, size=batch)
    out = {k: v[idx] for k, v in arrays.items()}
    for k in schema.observations:
        out[FINAL_PREFIX + k] = arrays[k][idx + 1]
    for k, v in scalars.items():
        out[k] = v[idx]
    return out


def bench_sampling(
    schema: StepSchema,
    per_writer: list[list[pa.RecordBatch]],
    root: Path,
    seconds: float,
    lerobot: bool = True,
) -> dict[str, float]:
    """Hot batch-256 sampling against the numpy gather (and LeRobot's buffer: ``lerobot``)."""
    n = sum(b.num_rows for bs in per_writer for b in bs)
    buf = ReplayBuffer.open(root / "hot", schema, HOT.model_copy(update={"prefetch": True}))
    fill(buf, per_writer)
    rng = np.random.default_rng(0)
    sampler = UniformSampler()
    warm_up(buf, lambda: buf.sample(BATCH, sampler, rng=rng))
    arrays, scalars = contiguous_columns(schema, per_writer)
    t_ours, t_gather = time_pair(
        lambda: buf.sample(BATCH, sampler, rng=rng),
        lambda: numpy_gather(schema, arrays, scalars, rng),
        seconds,
    )
    hit = buf.stats()["cache_hit_rate"]
    buf.close()
    shutil.rmtree(root / "hot")
    out = {"hot_sample_ms": t_ours * 1e3, "gather_sample_ms": t_gather * 1e3, "hot_hit_rate": hit}
    if lerobot:
        out["lerobot_sample_ms"] = bench_lerobot(arrays, scalars, min(n, 6000), seconds) * 1e3
    return out


def warm_up(buf: ReplayBuffer, sample: Callable[[], Any], timeout_s: float = 120.0) -> None:
    """Sample until the prefetch thread has promoted every sealed chunk into RAM: segments of
    camera-sized rows are cold when sealed (``buffer.table.tail_reads``) and turn hot as sampling
    heats them, so "hot" is the state a learner reaches after sampling a while.

    Raises:
        RuntimeError: chunks were still cold after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while any(not c.hot for c in buf.storage.chunks if c.sealed):
        if time.monotonic() > deadline:
            raise RuntimeError(f"chunks still cold after {timeout_s:.0f} s of sampling")
        sample()
        time.sleep(0.01)


def bench_lerobot(
    arrays: dict[str, np.ndarray], scalars: dict[str, np.ndarray], n: int, seconds: float
) -> float:
    """Seconds per batch-256 ``sample`` of LeRobot's RL replay buffer holding ``n`` steps."""
    import torch
    from lerobot.rl.buffer import ReplayBuffer as LeRobotReplayBuffer

    torch.set_num_threads(2)
    obs = [k for k in arrays if k.startswith("observation.")]
    rb = LeRobotReplayBuffer(
        capacity=n,
        device="cpu",
        storage_device="cpu",
        state_keys=obs,
        use_drq=False,
        optimize_memory=True,
    )
    with warnings.catch_warnings():  # read-only Arrow-backed arrays; torch only reads them
        warnings.simplefilter("ignore", UserWarning)
        obs_t = {k: torch.from_numpy(arrays[k][: n + 1]) for k in obs}
        act_t = torch.from_numpy(arrays["action"][:n])
    for i in range(n):
        rb.add(
            state={k: v[i : i + 1] for k, v in obs_t.items()},
            action=act_t[i : i + 1],
            reward=float(scalars["reward"][i]),
            next_state={k: v[i + 1 : i + 2] for k, v in obs_t.items()},
            done=bool(scalars["terminated"][i]),
            truncated=bool(scalars["truncated"][i]),
        )
    return time_calls(lambda: rb.sample(BATCH), seconds)


def bench_cold(
    schema: StepSchema, per_writer: list[list[pa.RecordBatch]], root: Path, seconds: float
) -> dict[str, float]:
    """Batch-256 sampling from a buffer holding twice its memory budget."""
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
    t_cold = time_calls(lambda: buf.sample(BATCH, sampler, rng=rng), seconds)
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
