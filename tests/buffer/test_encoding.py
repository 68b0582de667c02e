"""The insert path's Arrow shortcuts: the zero-copy IPC message and the small columns."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pytest

from buffer.columns import StepColumns, Strings
from buffer.encoding import ipc_pieces, pieces_size
from buffer.wal import pieces_header, record_header
from tests.buffer.helpers import episodes, small_schema, step


def _batches() -> list[pa.RecordBatch]:
    s = small_schema(image=(40, 40, 3))  # 4.8 KB frames: 64 of them are one large piece
    full = s.validate(s.batch_from_records(episodes(0, [30, 40], image=(40, 40, 3))))
    mixed = [step(r, 100 + r, 0, 0, image=(40, 40, 3)) for r in range(3)]
    mixed[1]["action.policy"] = np.ones(2, np.float32)
    return [
        full,
        full.slice(7, 21),  # offsets into every buffer
        full.filter(pa.array(np.arange(70) % 3 != 0)),  # what de-duplication does
        s.validate(s.batch_from_records(mixed)),  # several robots, a partly null column
    ]


@pytest.mark.parametrize("which", range(4))
def test_pieces_are_exactly_the_serialized_message(which: int) -> None:
    batch = _batches()[which]
    pieces = ipc_pieces(batch)
    assert b"".join(bytes(p) for p in pieces) == batch.serialize().to_pybytes()
    assert pieces_size(pieces) == batch.serialize().size
    # The WAL header over the pieces is the one over the joined bytes (same checksum).
    assert pieces_header(12, pieces) == record_header(12, batch.serialize().to_pybytes())


def test_large_buffers_are_views_not_copies() -> None:
    batch = _batches()[0]
    frames = batch.column("observation.images.front").values.buffers()[1]
    addresses = [p.address for p in ipc_pieces(batch) if isinstance(p, pa.Buffer)]
    assert frames.address in addresses


def test_pieces_from_many_threads_at_once() -> None:
    batches = _batches()
    want = [b.serialize().to_pybytes() for b in batches]
    bad: list[int] = []

    def work() -> None:
        for _ in range(50):
            for b, w in zip(batches, want, strict=True):
                if b"".join(bytes(p) for p in ipc_pieces(b)) != w:
                    bad.append(1)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad


@pytest.mark.parametrize(
    "values",
    [
        ["a"] * 5,
        ["ab", "ab"],
        ["ab", "ba"],
        ["a", "aa", ""],  # same total length as three equal one-byte strings
        ["", "", ""],
        ["x", "", ""],
        ["é", "é"],
        ["r", "q", "r"],
    ],
)
def test_strings_encode_like_a_dictionary(values: list[str]) -> None:
    for arr in (pa.array(values), pa.array(["z", *values, "z"]).slice(1, len(values))):
        s = Strings.of(arr)
        assert [s.names[c] for c in s.codes] == values
        assert s.single == (len(set(values)) == 1)
        assert s.byte_lengths().tolist() == [len(v.encode()) for v in values]


def test_step_columns_match_the_batch() -> None:
    batch = _batches()[3]
    c = StepColumns.of(batch)
    assert c.n == batch.num_rows
    for name in ("seq", "episode_index", "terminated", "reward"):
        np.testing.assert_array_equal(c.num[name], batch.column(name).to_pylist())
    assert [c.robot.value(i) for i in range(c.n)] == batch.column("robot_id").to_pylist()
    kept = c.take(np.array([True, False, True]))
    assert kept.n == 2 and kept.robot.value(1) == "robot-2"
