"""``comms.wire.steps.decode_batch``: whose rows a batch holds, checked without compute kernels."""

from __future__ import annotations

import pyarrow as pa
import pytest

from comms.wire.steps import ForeignRowsError, StepFormatError, decode_batch


def _stream(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _ipc(robot_ids: list[object], run_ids: list[str | None] | None = None) -> bytes:
    cols = {"seq": pa.array(range(len(robot_ids)), pa.int64()), "robot_id": pa.array(robot_ids)}
    if run_ids is not None:
        cols["run_id"] = pa.array(run_ids, pa.string())
    return _stream(pa.record_batch(cols).slice(1))  # an offset into every buffer


@pytest.mark.parametrize("ids", [["7"] * 4, [7] * 4])
def test_rows_of_the_caller_pass(ids: list[object]) -> None:
    batch = decode_batch(_ipc(ids, ["run-a"] * 4), robot_id=7, run_id="run-a")
    assert batch.num_rows == 3 and batch.column("seq").to_pylist() == [1, 2, 3]


@pytest.mark.parametrize(
    ("ids", "runs"),
    [
        (["8"] * 4, ["run-a"] * 4),  # another robot
        (["7", "7", "8", "7"], ["run-a"] * 4),  # one row of another robot
        (["7", "7", "7", "77"], ["run-a"] * 4),  # a longer id sharing the prefix
        ([7, 7, 8, 7], ["run-a"] * 4),
        (["7"] * 4, ["run-a", "run-a", "run-b", "run-a"]),  # one row of another run
        (["7"] * 4, ["run-a", "run-a", None, "run-a"]),  # a null run is not this run
    ],
)
def test_a_row_of_another_robot_or_run_is_refused(
    ids: list[object], runs: list[str | None]
) -> None:
    with pytest.raises(ForeignRowsError):
        decode_batch(_ipc(ids, runs), robot_id=7, run_id="run-a")


def test_seq_must_increase() -> None:
    batch = pa.record_batch({"seq": pa.array([3, 2], pa.int64()), "robot_id": pa.array([1, 1])})
    with pytest.raises(StepFormatError, match="strictly increasing"):
        decode_batch(_stream(batch))
