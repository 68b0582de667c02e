"""The steps ``robofleet bench buffer`` writes: schemas and record batches of robots' steps.

Two step shapes: the default (one 84x84x3 camera, a 32-d state, a 7-d action: ~21 KB) and the
camera-sized one (two 128x128x3 cameras and the state: ~98 KB, a real robot's two cameras).
Batches are ``chunk`` steps of one robot in episodes of ``episode_len`` steps; done steps carry
their final observation, as robots send them.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from buffer.table.features import FINAL_PREFIX
from buffer.table.schema import StepSchema

DEFAULT_CAMERAS = {"front": (84, 84, 3)}
ROBOT_CAMERAS = {"front": (128, 128, 3), "wrist": (128, 128, 3)}


def bench_schema(cameras: dict[str, tuple[int, int, int]] | None = None) -> StepSchema:
    """A 32-d state, ``cameras`` (name -> HWC shape; the default one 84x84x3 camera) and a
    7-d action."""
    features: dict[str, dict[str, object]] = {
        "observation.state": {"dtype": "float32", "shape": (32,)}
    }
    for name, shape in (cameras or DEFAULT_CAMERAS).items():
        features[f"observation.images.{name}"] = {"dtype": "image", "shape": shape}
    return StepSchema.from_features(features, {"action": {"dtype": "float32", "shape": (7,)}})


def make_batches(
    schema: StepSchema,
    robot: str,
    chunks: int,
    rng: np.random.Generator,
    chunk: int = 64,
    episode_len: int = 200,
    seq0: int = 0,
) -> list[pa.RecordBatch]:
    """``chunks`` record batches of ``chunk`` steps of ``robot`` (random frames and states),
    its seqs from ``seq0`` on (a robot that keeps recording: ``buffer.bench.learner_view``)."""
    n = chunks * chunk
    seq = seq0 + np.arange(n, dtype=np.int64)
    frame = seq % episode_len
    done = frame == episode_len - 1
    values: dict[str, np.ndarray] = {}
    for name, f in schema.observations.items():
        if f.is_image:
            values[name] = rng.integers(0, 256, size=(n, f.size), dtype=np.uint8)
        else:
            values[name] = rng.standard_normal((n, f.size), dtype=np.float32)
    action = rng.standard_normal((n, schema.action.size), dtype=np.float32)
    out = []
    for c in range(chunks):
        s = slice(c * chunk, (c + 1) * chunk)
        cols: dict[str, pa.Array] = {
            "seq": pa.array(seq[s]),
            "robot_id": pa.array([robot] * chunk),
            "run_id": pa.array(["bench"] * chunk),
            "task": pa.array(["reach-v3"] * chunk),
            "episode_index": pa.array(seq[s] // episode_len),
            "frame_index": pa.array(frame[s]),
            "timestamp": pa.array(frame[s] / 10.0),
            "reward": pa.array(rng.random(chunk, dtype=np.float32)),
            "terminated": pa.array(done[s]),
            "truncated": pa.array(np.zeros(chunk, dtype=bool)),
            "is_intervention": pa.array(rng.random(chunk) < 0.1),
            "policy_version": pa.array(np.zeros(chunk, dtype=np.int64)),
        }
        for name, f in schema.observations.items():
            cols[name] = pa.FixedSizeListArray.from_arrays(
                pa.array(values[name][s].ravel()), f.size
            )
            finals = [
                values[name][i].tobytes() if done[i] else None for i in range(s.start, s.stop)
            ]
            cols[FINAL_PREFIX + name] = pa.array(finals, type=pa.large_binary())
        cols["action"] = pa.FixedSizeListArray.from_arrays(
            pa.array(action[s].ravel()), schema.action.size
        )
        out.append(pa.RecordBatch.from_pydict(cols))
    return out


def writer_batches(
    schema: StepSchema, writers: int, chunks: int, chunk: int, seed: int = 42
) -> list[list[pa.RecordBatch]]:
    """The batches of ``writers`` robots (``robot-<i>``), one list per robot."""
    rng = np.random.default_rng(seed)
    return [make_batches(schema, f"robot-{i}", chunks, rng, chunk) for i in range(writers)]


def payload_bytes(per_writer: list[list[pa.RecordBatch]]) -> int:
    """Bytes of the batches as Arrow holds them (what both sides of the ingest bench write)."""
    return sum(b.nbytes for bs in per_writer for b in bs)
