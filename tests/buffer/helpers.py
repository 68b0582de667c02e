"""Shared builders: a small step schema and steps whose payload encodes (robot, seq)."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from buffer import BufferSettings, ReplayBuffer, StepSchema

IMAGE = (6, 5, 3)
BATCH_TOKEN = "batch-token-of-the-tests"  # the tests' batch servers and clients share it


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


class Appends:
    """Appends to ``buf`` in threads of their own; ``out[name]`` is each one's result, or
    what it raised."""

    def __init__(self, buf: ReplayBuffer) -> None:
        self.buf = buf
        self.out: dict[str, Any] = {}

    def start(self, name: str, records: Any, timeout: float | None = None) -> threading.Thread:
        def run() -> None:
            try:
                self.out[name] = self.buf.append(records, timeout=timeout)
            except Exception as exc:  # noqa: BLE001 - the test looks at it
                self.out[name] = exc

        t = threading.Thread(target=run)
        t.start()
        return t


class HeldCombiner:
    """Holds the first group staged after :meth:`hold` until :meth:`release`, so appends
    made meanwhile queue behind it (``buffer.table.combiner``). A context manager that puts the
    combiner's stage back."""

    def __init__(self, buf: ReplayBuffer) -> None:
        self.combiner = buf.writer.admission._combiner
        self._real = self.combiner._stage_group
        self._gate = threading.Event()
        self.calls = 0

    def __enter__(self) -> HeldCombiner:
        def held(group: list[Any], staged: Any) -> None:
            self.calls += 1
            if self.calls == 1:
                assert self._gate.wait(10)
            self._real(group, staged)

        self.combiner._stage_group = held  # type: ignore[method-assign]
        return self

    def wait_held(self) -> None:
        """Until a group is held."""
        _until(lambda: self.calls > 0)

    def wait_queued(self, n: int) -> None:
        """Until ``n`` appends are queued behind the held group."""
        _until(lambda: len(self.combiner._queue) >= n)

    def release(self) -> None:
        self._gate.set()

    def __exit__(self, *exc: object) -> None:
        self._gate.set()
        self.combiner._stage_group = self._real  # type: ignore[method-assign]


def _until(cond: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)
