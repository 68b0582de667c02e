"""``robofleet bench data``: LeRobot import and export, and sampling an imported dataset, each
beside its baseline in the same run.

The data: a LeRobotDataset v3 written with LeRobot's own API (``create`` / ``add_frame`` /
``save_episode`` / ``finalize``): PNG camera frames (84x84x3 uint8; 48x48 with ``--quick``),
a 16-d float32 state, a 4-d float32 action, ``next.reward``, ``next.done`` and
``complementary_info.is_intervention``.

* import: ``lab_data.import_lerobot`` of the dataset (every PNG decoded, stored durably) vs
  LeRobot's ``LeRobotDataset`` reading the same frames (``ds[i]`` for every frame, the
  dataset's own iteration: parquet rows, PNG decode, tensors).
* export: ``lab_data.export_lerobot`` of the imported buffer vs LeRobot's writer given the same
  frames from RAM (``add_frame`` / ``save_episode`` / ``finalize``: what writing costs
  LeRobot itself, so the ratio is the price of reading our buffer).
* sampling: ``ReplayBuffer.sample`` of batches of 256 transitions (images, next
  observations, flags) from the imported dataset mounted into an empty run buffer
  (``MixSampler`` with online fraction 0: all offline) vs a plain numpy gather of the same
  frames from contiguous in-memory arrays (observations at ``i``, next observations at
  ``i + 1``, action, reward and flags).

Rounds alternate the two sides; ratios use each side's median. Throughput in frames/s and
MB/s of decoded frame bytes (image + state + action). Prints a table, then one JSON object as
the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from foundation.clitext import plain_text

BATCH = 256
STATE, ACTION = 16, 4


def make_dataset(
    root: Path, episodes: int, length: int, image: tuple[int, int, int], seed: int = 0
) -> tuple[dict[str, np.ndarray], float]:
    """Write the dataset with LeRobot's API; returns the frames (numpy, dataset order) and
    the seconds LeRobot's writer took."""
    rng = np.random.default_rng(seed)
    n = episodes * length
    frames: dict[str, np.ndarray] = {
        "observation.state": rng.standard_normal((n, STATE), dtype=np.float32),
        "observation.images.front": rng.integers(0, 256, (n, *image), dtype=np.uint8),
        "action": rng.uniform(-1, 1, (n, ACTION)).astype(np.float32),
    }
    return frames, write_lerobot(root, frames, episodes, length)


def write_lerobot(root: Path, frames: dict[str, np.ndarray], episodes: int, length: int) -> float:
    """LeRobot's writer given ``frames`` from RAM; returns its seconds."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    image = frames["observation.images.front"].shape[1:]
    features = {
        "observation.state": {"dtype": "float32", "shape": (STATE,), "names": None},
        "observation.images.front": {
            "dtype": "image",
            "shape": image,
            "names": ["height", "width", "channels"],
        },
        "action": {"dtype": "float32", "shape": (ACTION,), "names": None},
        "next.reward": {"dtype": "float32", "shape": (1,), "names": None},
        "next.done": {"dtype": "bool", "shape": (1,), "names": None},
        "complementary_info.is_intervention": {"dtype": "float32", "shape": (1,), "names": None},
    }
    t0 = time.perf_counter()
    ds = LeRobotDataset.create(
        "local/bench", 10, features, root=root, use_videos=False, video_backend="pyav"
    )
    for e in range(episodes):
        for i in range(length):
            j = e * length + i
            last = i == length - 1
            ds.add_frame(
                {
                    **{k: v[j] for k, v in frames.items()},
                    "next.reward": np.array([float(last and e % 2 == 0)], np.float32),
                    "next.done": np.array([last]),
                    "complementary_info.is_intervention": np.array([float(i % 4 == 0)], np.float32),
                    "task": "pick",
                }
            )
        ds.save_episode()
    ds.finalize()
    return time.perf_counter() - t0


def lerobot_read(root: Path) -> float:
    """Seconds for LeRobot's ``LeRobotDataset`` to read every frame (``ds[i]``)."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    t0 = time.perf_counter()
    ds = LeRobotDataset("local/bench", root=root, video_backend="pyav")
    for i in range(len(ds)):
        ds[i]
    return time.perf_counter() - t0


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_io(
    work: Path, frames: dict[str, np.ndarray], shape: tuple[int, int], rounds: int
) -> dict[str, float]:
    """Interleaved rounds of import vs LeRobot reading, export vs LeRobot writing."""
    from buffer.table.replay_buffer import ReplayBuffer
    from lab_data.lerobot_io import export_lerobot, import_lerobot

    episodes, length = shape
    src = work / "dataset"
    t: dict[str, list[float]] = {"import": [], "read": [], "export": [], "write": []}
    for r in range(rounds):
        t["read"].append(lerobot_read(src))
        dest = work / f"imported-{r}"
        t["import"].append(timed(lambda: import_lerobot(src, dest)))  # noqa: B023
        with ReplayBuffer.open(dest, read_only=True) as buf:
            out = work / f"export-{r}"
            t["export"].append(timed(lambda: export_lerobot(buf, out, "local/x", 10)))  # noqa: B023
        t["write"].append(write_lerobot(work / f"rewrite-{r}", frames, episodes, length))
        for d in (out, work / f"rewrite-{r}"):
            shutil.rmtree(d)
        if r:
            shutil.rmtree(dest)
    return {f"{k}_s": statistics.median(v) for k, v in t.items()}


def bench_sampling(work: Path, seconds: float) -> dict[str, float]:
    """``sample`` of a mounted imported dataset vs a numpy gather of the same frames."""
    from buffer.sampling.samplers import MixSampler
    from buffer.table.replay_buffer import ReplayBuffer

    imported = work / "imported-0"
    rng = np.random.default_rng(1)
    with ReplayBuffer.open(imported, read_only=True) as src:
        n = src.visible
        arrays = src.read_transitions(np.arange(n), count=False)
        schema = src.schema
    obs = arrays["observation.images.front"]
    state, action = arrays["observation.state"], arrays["action"]
    flags = {k: arrays[k] for k in ("reward", "terminated", "truncated", "is_intervention")}

    def gather() -> None:
        i = rng.integers(0, n - 1, BATCH)
        _ = (obs[i], obs[i + 1], state[i], state[i + 1], action[i])
        _ = [v[i] for v in flags.values()]

    sampler = MixSampler(online_fraction=0.0)
    with ReplayBuffer.open(work / "run", schema) as run:
        run.mount(imported)
        sample_ms, gather_ms = [], []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            sample_ms.append(1e3 * timed(lambda: run.sample(BATCH, sampler=sampler, rng=rng)))
            gather_ms.append(1e3 * timed(gather))
    return {
        "sample_ms": statistics.median(sample_ms),
        "gather_ms": statistics.median(gather_ms),
        "sample_batches": len(sample_ms),
    }


def report(r: dict[str, float], frames: int, frame_bytes: int) -> dict[str, Any]:
    mb = frames * frame_bytes / 1e6
    out: dict[str, Any] = {"frames": frames, "frame_bytes": frame_bytes, "batch": BATCH}
    for k in ("import", "read", "export", "write"):
        out[f"{k}_frames_per_s"] = round(frames / r[f"{k}_s"], 1)
        out[f"{k}_mb_per_s"] = round(mb / r[f"{k}_s"], 2)
    out["import_ratio_vs_lerobot_read"] = round(r["read_s"] / r["import_s"], 3)
    out["export_ratio_vs_lerobot_read"] = round(r["read_s"] / r["export_s"], 3)
    out["export_ratio_vs_lerobot_write"] = round(r["write_s"] / r["export_s"], 3)
    out["sample_ratio_vs_gather"] = round(r["gather_ms"] / r["sample_ms"], 3)
    out["sample_ms"] = round(r["sample_ms"], 3)
    out["gather_ms"] = round(r["gather_ms"], 3)
    out["sample_frames_per_s"] = round(BATCH / (r["sample_ms"] / 1e3), 1)
    return out


def print_table(res: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"robofleet bench data ({res['frames']} frames, {res['frame_bytes']} B each)")
    for col in ("path", "frames/s", "MB/s", "baseline", "frames/s ", "ratio"):
        t.add_column(col, justify="right" if col != "path" else "left")
    for ours, base, ratio in (
        ("import", "read", "import_ratio_vs_lerobot_read"),
        ("export", "read", "export_ratio_vs_lerobot_read"),
        ("export", "write", "export_ratio_vs_lerobot_write"),
    ):
        t.add_row(
            ours,
            f"{res[f'{ours}_frames_per_s']:.0f}",
            f"{res[f'{ours}_mb_per_s']:.1f}",
            f"LeRobot {base}",
            f"{res[f'{base}_frames_per_s']:.0f}",
            f"{res[ratio]:.2f}",
        )
    t.add_row(
        f"sample {BATCH}",
        f"{res['sample_frames_per_s']:.0f}",
        f"{res['sample_ms']:.2f} ms",
        "numpy gather",
        f"{BATCH / (res['gather_ms'] / 1e3):.0f}",
        f"{res['sample_ratio_vs_gather']:.2f}",
    )
    Console().print(t)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="robofleet bench data", description=plain_text(__doc__))
    parser.add_argument("--config", default=None, help="robofleet settings file")
    parser.add_argument("--quick", action="store_true", help="small data, one round")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (3)")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    parser.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    args = parser.parse_args(list(argv))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import datasets

    datasets.disable_progress_bars()
    episodes, length = (4, 40) if args.quick else (10, 100)
    image = (48, 48, 3) if args.quick else (84, 84, 3)
    rounds = args.rounds or (1 if args.quick else 3)
    work = Path(tempfile.mkdtemp(prefix="bench-data-", dir=args.dir))
    try:
        frames, _ = make_dataset(work / "dataset", episodes, length, image)
        r = bench_io(work, frames, (episodes, length), rounds)
        r.update(bench_sampling(work, 1.0 if args.quick else 4.0))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    frame_bytes = int(np.prod(image)) + 4 * (STATE + ACTION)
    res = report(r, episodes * length, frame_bytes)
    if not args.json:
        print_table(res)
    print(json.dumps(res))
    return 0
