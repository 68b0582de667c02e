"""Shared builders: a small step schema and steps whose payload encodes (robot, seq)."""

from __future__ import annotations

from typing import Any

import numpy as np

from buffer import BufferSettings, ReplayBuffer, StepSchema

IMAGE = (6, 5, 3)


def small_schema(image: tuple[int, int, int] = IMAGE, **kw: Any) -> StepSchema:
    return StepSchema.from_features(
        {
            "observation.state": {"dtype": "float32", "shape": (3,), "names": ["x", "y", "z"]},
            "observation.images.front": {"dtype": "image", "shape": image},
        },
        {"action": {"dtype": "float32", "shape": (2,)}},
        **kw,
    )


def obs_value(robot: int, seq: int) -> float:
    """The state value of a step: unique per (robot, seq)."""
    return float(robot * 100_000 + seq)


def final_value(robot: int, seq: int) -> float:
    return -obs_value(robot, seq) - 1


def step(
    robot: int,
    seq: int,
    episode: int,
    frame: int,
    *,
    image: tuple[int, int, int] = IMAGE,
    terminated: bool = False,
    truncated: bool = False,
    intervention: bool = False,
    task: str = "reach",
    run: str = "run-a",
    policy_version: int = 0,
) -> dict[str, Any]:
    v = obs_value(robot, seq)
    rec: dict[str, Any] = {
        "seq": seq,
        "robot_id": f"robot-{robot}",
        "run_id": run,
        "task": task,
        "episode_index": episode,
        "frame_index": frame,
        "timestamp": frame / 10.0,
        "reward": float(seq % 13),
        "terminated": terminated,
        "truncated": truncated,
        "is_intervention": intervention,
        "policy_version": policy_version,
        "observation.state": np.full(3, v, dtype=np.float32),
        "observation.images.front": np.full(image, seq % 251, dtype=np.uint8),
        "action": np.full(2, v, dtype=np.float32),
    }
    if terminated or truncated:
        rec["next.observation.state"] = np.full(3, final_value(robot, seq), dtype=np.float32)
        rec["next.observation.images.front"] = np.full(image, 255, dtype=np.uint8)
    return rec


def episodes(
    robot: int,
    lengths: list[int],
    *,
    seq0: int = 0,
    ep0: int = 0,
    truncate_every: int = 2,
    **kw: Any,
) -> list[dict[str, Any]]:
    """Complete episodes of one robot; every ``truncate_every``-th ends truncated."""
    out = []
    seq = seq0
    for e, n in enumerate(lengths):
        for f in range(n):
            last = f == n - 1
            trunc = last and (e % truncate_every == 1)
            out.append(
                step(robot, seq, ep0 + e, f, terminated=last and not trunc, truncated=trunc, **kw)
            )
            seq += 1
    return out


def open_buffer(path: Any, schema: StepSchema | None = None, **settings: Any) -> ReplayBuffer:
    defaults: dict[str, Any] = {"segment_target_bytes": 4096, "memory_budget_bytes": 1 << 24}
    defaults.update(settings)
    return ReplayBuffer.open(path, schema or small_schema(), BufferSettings(**defaults))
