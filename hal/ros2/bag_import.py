"""Import recorded ROS 2 bags (rosbag2, via ``rosbags``) as offline LeRobot-style steps.

One bag is one episode. Each message on ``state_topic`` (sensor_msgs/JointState) is a frame:
``observation.state`` = positions of ``joints`` (float32), ``action`` = the positions of the
latest message on ``command_topic`` at or after that frame and before the next one (the command
that followed the observation), else the next frame's positions (a recorded teleoperation has
no separate command topic). Columns: ``observation.state``, ``action``, ``timestamp`` (s since
the bag's first frame), ``frame_index``, ``episode_index``, ``index``, ``task``, ``reward``,
``terminated``, ``truncated``, ``is_intervention`` (True: a person drove the recording).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa


class BagImportError(ValueError):
    """The bag is missing, lacks the topic, or its messages lack the named joints."""


def _positions(msg: object, joints: Sequence[str], where: str) -> list[float]:
    names = list(msg.name)  # type: ignore[attr-defined]
    index = {n: i for i, n in enumerate(names)}
    missing = [j for j in joints if j not in index]
    if missing:
        raise BagImportError(f"{where}: JointState lacks joints {missing} (has {names})")
    pos = msg.position  # type: ignore[attr-defined]
    return [float(pos[index[j]]) for j in joints]


def import_bag(
    path: str | Path,
    joints: Sequence[str],
    *,
    state_topic: str = "/joint_states",
    command_topic: str | None = "/joint_commands",
    task: str = "",
    episode_index: int = 0,
    start_index: int = 0,
) -> pa.Table:
    """Read one rosbag2 directory into an Arrow table of steps (columns in the module doc).

    Raises:
        BagImportError: no bag at ``path``, no ``state_topic`` in it, fewer than 2 frames, or
            a message without one of ``joints``.
    """
    from rosbags.highlevel import AnyReader

    path = Path(path)
    if not path.exists():
        raise BagImportError(f"no ROS 2 bag at {path}")
    frames: list[tuple[int, list[float]]] = []
    commands: list[tuple[int, list[float]]] = []
    with AnyReader([path]) as reader:
        topics = {c.topic for c in reader.connections}
        if state_topic not in topics:
            raise BagImportError(f"{path}: no topic {state_topic} (has {sorted(topics)})")
        wanted = [c for c in reader.connections if c.topic in (state_topic, command_topic)]
        for conn, t_ns, raw in reader.messages(connections=wanted):
            msg = reader.deserialize(raw, conn.msgtype)
            item = (t_ns, _positions(msg, joints, f"{path}:{conn.topic}@{t_ns}"))
            (frames if conn.topic == state_topic else commands).append(item)
    if len(frames) < 2:
        raise BagImportError(f"{path}: {len(frames)} frame(s) on {state_topic}; need 2")
    frames.sort(key=lambda f: f[0])
    commands.sort(key=lambda c: c[0])
    cmd_times = np.asarray([c[0] for c in commands], dtype=np.int64)
    actions = []
    for i, (t, pos) in enumerate(frames):
        nxt = frames[i + 1][0] if i + 1 < len(frames) else np.iinfo(np.int64).max
        j = int(np.searchsorted(cmd_times, nxt, side="left")) - 1
        if j >= 0 and cmd_times[j] >= t:
            actions.append(commands[j][1])
        else:
            actions.append(frames[min(i + 1, len(frames) - 1)][1] if not commands else pos)
    n = len(frames)
    t0 = frames[0][0]
    dim = len(joints)
    return pa.table(
        {
            "observation.state": pa.array(
                [np.asarray(p, np.float32) for _, p in frames], type=pa.list_(pa.float32(), dim)
            ),
            "action": pa.array(
                [np.asarray(a, np.float32) for a in actions], type=pa.list_(pa.float32(), dim)
            ),
            "timestamp": pa.array([(t - t0) / 1e9 for t, _ in frames], type=pa.float32()),
            "frame_index": pa.array(range(n), type=pa.int64()),
            "episode_index": pa.array([episode_index] * n, type=pa.int64()),
            "index": pa.array(range(start_index, start_index + n), type=pa.int64()),
            "task": pa.array([task] * n, type=pa.string()),
            "reward": pa.array([0.0] * n, type=pa.float32()),
            "terminated": pa.array([False] * (n - 1) + [True], type=pa.bool_()),
            "truncated": pa.array([False] * n, type=pa.bool_()),
            "is_intervention": pa.array([True] * n, type=pa.bool_()),
        }
    )
