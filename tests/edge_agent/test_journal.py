"""The uplink's open batch is durable step by step (``edge_agent.journal``): what a crash left
in the journal is spooled on restart, once, with the seqs it would have had."""

from __future__ import annotations

import numpy as np

from buffer.table.schema import StepSchema
from edge_agent.journal import FILE_NAME, StepJournal
from edge_agent.spool import Spool
from edge_agent.uplink import UplinkWorker
from tests.edge_agent.helpers import spooled_rows
from tests.fakes.robot import PointRobot


def record(frame: int, **kw: object) -> dict[str, object]:
    rec: dict[str, object] = {
        "robot_id": "robot-1",
        "run_id": "run-1",
        "task": "reach",
        "episode_index": 0,
        "frame_index": frame,
        "timestamp": frame / 100,
        "reward": np.float32(-0.5),  # a numpy scalar, as a driver may report it
        "terminated": False,
        "truncated": False,
        "is_intervention": frame % 2 == 1,
        "policy_version": 3,
        "action": np.full(4, frame, np.float32),
        "action.policy": None,
        "observation.state": np.arange(3, dtype=np.float32) + frame,
    }
    rec.update(kw)
    return rec


def uplink(tmp_path) -> UplinkWorker:
    robot = PointRobot()
    schema = StepSchema.from_features(robot.observation_features, robot.action_features)
    return UplinkWorker(Spool(tmp_path, 1 << 30), schema, batch_max_steps=20)


def test_records_round_trip_and_a_torn_last_frame_is_dropped(tmp_path):
    j = StepJournal(tmp_path)
    assert j.read() == (-1, [])
    j.append([record(0), record(1)], first_seq=7)
    j.append([record(2)], first_seq=99)  # only an empty journal notes its batch's first seq
    data = (tmp_path / FILE_NAME).read_bytes()
    (tmp_path / FILE_NAME).write_bytes(data[:-5])  # the last append torn by a crash
    first, got = StepJournal(tmp_path).read()
    assert first == 7 and len(got) == 2
    for frame, rec in enumerate(got):
        want = record(frame)
        assert set(rec) == set(want)
        for key, value in want.items():
            if isinstance(value, np.ndarray):
                assert rec[key].dtype == value.dtype and np.array_equal(rec[key], value)
            else:
                assert rec[key] == value, key
    j.clear()
    assert j.read() == (-1, []) and j.empty


def test_a_restarted_uplink_spools_the_steps_a_crash_left_in_its_journal(tmp_path):
    first = uplink(tmp_path).start()
    for f in range(3):
        first.submit(record(f))
    assert first.flush()  # seqs 0..2 in the spool
    # The agent is killed with four steps durable in the journal, its batch not cut yet.
    StepJournal(tmp_path).append([record(f) for f in range(3, 7)], first.spool.next_seq)
    again = uplink(tmp_path).start()
    rows = spooled_rows(again.spool)
    assert rows.column("seq").to_pylist() == list(range(7))
    assert rows.column("frame_index").to_pylist() == list(range(7))
    assert again.spool.next_seq == 7 and StepJournal(tmp_path).read() == (-1, [])
    # A crash between cutting that batch and emptying the journal: the steps are not
    # spooled twice.
    StepJournal(tmp_path).append([record(f) for f in range(3, 7)], 3)
    third = uplink(tmp_path).start()
    assert spooled_rows(third.spool).column("seq").to_pylist() == list(range(7))
    third.submit(record(7))
    assert third.flush()
    assert spooled_rows(third.spool).column("seq").to_pylist() == list(range(8))
    third.close()
