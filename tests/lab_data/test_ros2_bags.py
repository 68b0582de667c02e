"""ROS 2 bag import: a bag written with rosbags' writer becomes LeRobot-style Arrow steps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from rosbags.rosbag2 import StoragePlugin, Writer
from rosbags.typesys import Stores, get_typestore

from foundation.rows import RowFilter
from lab_data.ros2_bags import BagImportError, import_bag

JOINTS = ["j1", "j2"]


def _write_bag(path: Path, n: int, *, with_commands: bool = True) -> None:
    ts = get_typestore(Stores.ROS2_HUMBLE)
    JointState = ts.types["sensor_msgs/msg/JointState"]
    Header = ts.types["std_msgs/msg/Header"]
    Time = ts.types["builtin_interfaces/msg/Time"]

    def msg(names: list[str], pos: list[float]) -> object:
        return JointState(
            header=Header(stamp=Time(sec=0, nanosec=0), frame_id=""),
            name=names,
            position=np.asarray(pos, np.float64),
            velocity=np.zeros(0, np.float64),
            effort=np.zeros(0, np.float64),
        )

    with Writer(path, version=8, storage_plugin=StoragePlugin.SQLITE3) as w:
        state = w.add_connection("/joint_states", JointState.__msgtype__, typestore=ts)
        cmd = w.add_connection("/joint_commands", JointState.__msgtype__, typestore=ts)
        for i in range(n):
            t = 1_000_000_000 + i * 100_000_000
            # names deliberately in the other order: the import must reorder by name
            w.write(state, t, ts.serialize_cdr(msg(["j2", "j1"], [-i, i]), JointState.__msgtype__))
            if with_commands:
                w.write(
                    cmd,
                    t + 10_000_000,
                    ts.serialize_cdr(msg(JOINTS, [i + 0.5, 0.0]), JointState.__msgtype__),
                )


def test_bag_becomes_steps(tmp_path: Path) -> None:
    _write_bag(tmp_path / "bag", 5)
    table = import_bag(tmp_path / "bag", JOINTS, task="pick", episode_index=3, start_index=100)
    assert table.num_rows == 5
    state = np.asarray(table["observation.state"].to_pylist(), np.float32)
    np.testing.assert_array_equal(state[:, 0], np.arange(5))
    np.testing.assert_array_equal(state[:, 1], -np.arange(5))
    action = np.asarray(table["action"].to_pylist(), np.float32)
    np.testing.assert_allclose(action[:, 0], np.arange(5) + 0.5)
    assert table["frame_index"].to_pylist() == [0, 1, 2, 3, 4]
    assert table["index"].to_pylist() == [100, 101, 102, 103, 104]
    assert set(table["episode_index"].to_pylist()) == {3} and set(table["task"].to_pylist()) == {
        "pick"
    }
    np.testing.assert_allclose(table["timestamp"].to_pylist(), [0, 0.1, 0.2, 0.3, 0.4], atol=1e-6)
    assert table["terminated"].to_pylist()[-1] and all(table["is_intervention"].to_pylist())


def test_bad_bags_are_named(tmp_path: Path) -> None:
    with pytest.raises(BagImportError, match="no ROS 2 bag"):
        import_bag(tmp_path / "missing", JOINTS)
    _write_bag(tmp_path / "bag", 3)
    with pytest.raises(BagImportError, match="no topic /other"):
        import_bag(tmp_path / "bag", JOINTS, state_topic="/other")
    with pytest.raises(BagImportError, match=r"lacks joints \['j9'\]"):
        import_bag(tmp_path / "bag", ["j1", "j9"])


def test_bag_appends_into_a_replay_buffer_and_survives_a_reopen(tmp_path: Path) -> None:
    from buffer import ReplayBuffer
    from lab_data.ros2_bags import bag_schema, import_bag_into_buffer

    _write_bag(tmp_path / "bag0", 4)
    _write_bag(tmp_path / "bag1", 3)
    first = import_bag_into_buffer(tmp_path / "bag0", tmp_path / "buf", JOINTS, task="pick")
    assert first.acked == {"ros2-bag": 3} and first.stored == 4
    with ReplayBuffer.open(tmp_path / "buf") as buf:  # an open buffer: seqs continue
        second = import_bag_into_buffer(
            tmp_path / "bag1", buf, JOINTS, task="pick", episode_index=1
        )
        assert second.acked == {"ros2-bag": 6}
    with ReplayBuffer.open(tmp_path / "buf", read_only=True) as buf:
        assert buf.schema.same_columns(bag_schema(JOINTS))
        np.testing.assert_array_equal(buf.stored_seqs("ros2-bag"), np.arange(7))
        assert buf.num_steps == 7
        rows = buf.select(RowFilter(robot_ids=("ros2-bag",)))
        got = buf.read_transitions(rows, count=False)
    order = np.argsort(got["index"])
    state, action = got["observation.state"][order], got["action"][order]
    # bag0's frames 0..3 then bag1's 0..2: positions (i, -i), commands (i + 0.5, 0)
    frame = np.array([0, 1, 2, 3, 0, 1, 2])
    np.testing.assert_array_equal(state[:, 0], frame)
    np.testing.assert_array_equal(state[:, 1], -frame)
    np.testing.assert_allclose(action[:, 0], frame + 0.5)
    assert got["episode_index"][order].tolist() == [0, 0, 0, 0, 1, 1, 1]
    assert got["frame_index"][order].tolist() == frame.tolist()
    assert got["is_intervention"].all() and set(got["task"].tolist()) == {"pick"}
    assert got["terminated"][order].tolist() == [False, False, False, True] + [False, False, True]


def test_bag_into_a_buffer_of_another_schema_is_refused(tmp_path: Path) -> None:
    from lab_data.ros2_bags import import_bag_into_buffer

    _write_bag(tmp_path / "bag", 3)
    import_bag_into_buffer(tmp_path / "bag", tmp_path / "buf", JOINTS)
    with pytest.raises(ValueError, match="differs from the stored one"):
        import_bag_into_buffer(tmp_path / "bag", tmp_path / "buf", ["j1"])
