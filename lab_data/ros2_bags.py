"""Import recorded ROS 2 bags (rosbag2, via ``rosbags``) as offline LeRobot-style steps.

One bag is one episode. Each message on ``state_topic`` (sensor_msgs/JointState) is a frame:
``observation.state`` = positions of ``joints`` (float32), ``action`` = the positions of the
latest message on ``command_topic`` at or after that frame and before the next one (the command
that followed the observation), else the next frame's positions (a recorded teleoperation has
no separate command topic). Columns: ``observation.state``, ``action``, ``timestamp`` (s since
the bag's first frame), ``frame_index``, ``episode_index``, ``index``, ``task``, ``reward``,
``terminated``, ``truncated``, ``is_intervention`` (True: a person drove the recording).

:func:`import_bag_into_buffer` appends those steps to a ``buffer.ReplayBuffer`` (schema:
:func:`bag_schema`), where learners sample or mount them like any other run's data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from lab_data.importing import ImportJob

if TYPE_CHECKING:
    from buffer.config import BufferSettings
    from buffer.table.claim import AppendResult
    from buffer.table.replay_buffer import ReplayBuffer
    from buffer.table.schema import StepSchema


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


def joint_names(path: str | Path, state_topic: str = "/joint_states") -> list[str]:
    """The joint names of the first message on ``state_topic`` (sensor_msgs/JointState), in
    its order: the default ``joints`` of an import.

    Raises:
        BagImportError: no bag at ``path``, no such topic, or no message on it.
    """
    from rosbags.highlevel import AnyReader

    path = Path(path)
    if not path.exists():
        raise BagImportError(f"no ROS 2 bag at {path}")
    with AnyReader([path]) as reader:
        conns = [c for c in reader.connections if c.topic == state_topic]
        if not conns:
            topics = sorted({c.topic for c in reader.connections})
            raise BagImportError(f"{path}: no topic {state_topic} (has {topics})")
        for conn, _t, raw in reader.messages(connections=conns):
            return [str(n) for n in reader.deserialize(raw, conn.msgtype).name]  # type: ignore[attr-defined]
    raise BagImportError(f"{path}: no message on {state_topic}")


def bag_schema(joints: Sequence[str]) -> StepSchema:
    """The buffer step schema of imported bags: ``observation.state`` and ``action`` float32
    of shape ``(len(joints),)`` named by ``joints``; no final observation (a recording ends
    without one), as in ``lab_data.import_lerobot``."""
    from buffer.table.schema import StepSchema

    feat = {"dtype": "float32", "shape": (len(joints),), "names": list(joints)}
    return StepSchema.from_features(
        {"observation.state": feat}, {"action": feat}, require_final_observation=False
    )


def import_bag_into_buffer(
    bag: str | Path,
    buffer: str | Path | ReplayBuffer,
    joints: Sequence[str],
    *,
    robot_id: str = "ros2-bag",
    run_id: str | None = None,
    task: str = "",
    episode_index: int = 0,
    state_topic: str = "/joint_states",
    command_topic: str | None = "/joint_commands",
    settings: BufferSettings | None = None,
) -> AppendResult:
    """Append one rosbag2 recording (one episode) to a replay buffer, durably.

    Each frame of :func:`import_bag` becomes one buffer step: ``seq`` continues after the
    robot's highest durable seq in the buffer (0 for a new robot), so importing several bags
    under one ``robot_id`` appends them in order (give each its own ``episode_index``);
    ``run_id`` defaults to ``rosbag:<bag directory name>``; ``reward`` 0, ``policy_version``
    0, ``is_intervention`` True (a person drove the recording), the last frame terminated.

    Args:
        bag: the rosbag2 directory.
        buffer: an open :class:`buffer.ReplayBuffer` (left open), or a buffer directory that
            is opened (created with :func:`bag_schema` when new) and closed again.
        joints: joint names, in the order of the state/action vectors.
        settings: buffer settings when ``buffer`` is a directory.

    Returns:
        The buffer's ``AppendResult`` (``acked[robot_id]`` is the last imported seq).

    Raises:
        BagImportError: see :func:`import_bag`.
        ValueError: the directory's stored schema differs from :func:`bag_schema`.
        buffer.StepValidationError: the open buffer's schema does not fit these steps.
    """
    from buffer.table.replay_buffer import ReplayBuffer

    table = import_bag(
        bag,
        joints,
        state_topic=state_topic,
        command_topic=command_topic,
        task=task,
        episode_index=episode_index,
    )
    own = not isinstance(buffer, ReplayBuffer)
    buf = (
        buffer
        if isinstance(buffer, ReplayBuffer)
        else (ReplayBuffer.open(buffer, bag_schema(joints), settings))
    )
    try:
        last = buf.durable_seq(robot_id)
        first_seq = 0 if last is None else last + 1
        cols = table.to_pydict()
        run = run_id or f"rosbag:{Path(bag).name}"
        records: list[dict[str, Any]] = [
            {
                "seq": first_seq + i,
                "robot_id": robot_id,
                "run_id": run,
                "task": cols["task"][i],
                "episode_index": cols["episode_index"][i],
                "frame_index": cols["frame_index"][i],
                "timestamp": cols["timestamp"][i],
                "reward": cols["reward"][i],
                "terminated": cols["terminated"][i],
                "truncated": cols["truncated"][i],
                "is_intervention": cols["is_intervention"][i],
                "policy_version": 0,
                "observation.state": np.asarray(cols["observation.state"][i], np.float32),
                "action": np.asarray(cols["action"][i], np.float32),
            }
            for i in range(table.num_rows)
        ]
        return buf.append(records)
    finally:
        if own:
            buf.close()


def _is_bag(path: Path) -> bool:
    if path.is_file():
        return path.suffix in (".mcap", ".db3")
    return (path / "metadata.yaml").is_file() or any(
        p.suffix in (".mcap", ".db3") for p in path.iterdir()
    )


def bags_at(path: Path) -> list[Path]:
    """The bags at ``path``: itself, or its sub-directories that are bags (name order)."""
    if _is_bag(path):
        return [path]
    if not path.is_dir():
        return []
    return sorted(p for p in path.iterdir() if p.is_dir() and _is_bag(p))


class Ros2BagImporter:
    """rosbag2 recordings (a bag directory, a ``*.mcap`` / ``*.db3`` file, or a directory of
    bags): one bag is one episode, in name order."""

    format = "ros2"
    recognised_by = "metadata.yaml, *.mcap or *.db3 (ROS 2 bag)"
    options: tuple[str, ...] = ("joints", "state_topic", "command_topic", "run_id")
    keeps_robot_ids = False

    def detect(self, path: Path) -> bool:
        return bool(bags_at(path))

    def schema(
        self, path: Path, options: Mapping[str, Any], task: str | None
    ) -> tuple[StepSchema, list[str]]:
        """:func:`bag_schema` of ``options["joints"]`` (a bag names its joints only in its
        messages).

        Raises:
            ValueError: ``options.joints`` is not a non-empty list.
        """
        joints = options.get("joints")
        if not isinstance(joints, list) or not joints:
            raise ValueError("a ROS 2 bag needs options.joints: the joint names of its state")
        return bag_schema(joints), [task or ""]

    def import_into(self, job: ImportJob) -> Path:
        """Every bag at ``job.source`` into ``job.dest`` under one robot id, in name order
        (``joints`` default: those of the first bag's first state message).

        Raises:
            ValueError: no bag at ``source``; :class:`BagImportError` (see :func:`import_bag`).
        """
        from buffer.table.replay_buffer import ReplayBuffer

        bags, opts = bags_at(job.source), job.options
        if not bags:
            raise ValueError(f"{job.source}: no ROS 2 bag (metadata.yaml, *.mcap or *.db3)")
        state_topic = opts.get("state_topic") or "/joint_states"
        joints = list(opts.get("joints") or joint_names(bags[0], state_topic))
        with ReplayBuffer.open(job.dest, bag_schema(joints)) as buf:
            for i, bag in enumerate(bags):
                import_bag_into_buffer(
                    bag,
                    buf,
                    joints,
                    robot_id=job.robot_id or "ros2-bag",
                    run_id=opts.get("run_id") or f"rosbag:{job.source.name}",
                    task=job.task or "",
                    episode_index=i,
                    state_topic=state_topic,
                    command_topic=opts.get("command_topic", "/joint_commands"),
                )
                if job.progress is not None:
                    job.progress(i + 1, len(bags))
        return job.dest
