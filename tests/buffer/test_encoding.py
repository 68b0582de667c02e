"""The insert path's Arrow shortcuts: the zero-copy IPC message and the small columns."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pytest

from buffer.columns import (
    StepColumns,
    Strings,
    all_finite,
    binary_lengths,
    fixed_list_slots,
    fixed_list_values,
    numpy_view,
    valid_mask,
)
from buffer.files.encoding import ipc_message, ipc_pieces, pieces_size
from buffer.files.wal import pieces_header, record_header
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


@pytest.mark.parametrize("which", range(4))
def test_message_offsets_locate_each_rows_values(which: int) -> None:
    """``ipc_message`` says where a column's row 0 values sit in the message; row ``i`` is
    ``i`` widths further (what the open tail reads back from its WAL), for a whole batch,
    a slice, a filtered copy and a batch of a few rows (small pieces, joined)."""
    batch = _batches()[which]
    names = ["observation.images.front", "observation.state", "action"]
    pieces, offsets = ipc_message(batch, names)
    assert offsets is not None
    msg = np.frombuffer(b"".join(bytes(p) for p in pieces), dtype=np.uint8)
    assert msg.tobytes() == batch.serialize().to_pybytes()
    for name, off in zip(names, offsets, strict=True):
        want = fixed_list_values(batch.column(name))
        np.testing.assert_array_equal(msg[off : off + want.nbytes].view(want.dtype), want)


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


def _slices(arr: pa.Array) -> list[pa.Array]:
    """``arr`` and slices of it starting at every bit of a byte (bitmaps) and past it."""
    return [arr.slice(off, ln) for off in range(10) for ln in (0, 1, 7, len(arr) - off)]


@pytest.mark.parametrize(
    ("values", "typ"),
    [
        ([True, False, True, True, False, False, True, False, True, True, False] * 2, pa.bool_()),
        (list(range(-5, 17)), pa.int64()),
        ([0.5, -1.25, 3.0] * 7, pa.float32()),
        ([1e300, -2.5] * 11, pa.float64()),
        ([1, None, 3] * 7, pa.int64()),  # nulls: pyarrow's own conversion (NaN where null)
    ],
)
def test_numpy_views_equal_pyarrows_conversion(values: list[object], typ: pa.DataType) -> None:
    for s in _slices(pa.array(values, type=typ)):
        got, want = numpy_view(s), s.to_numpy(zero_copy_only=False)
        assert got.dtype == want.dtype and len(got) == len(s)
        np.testing.assert_array_equal(got, want)


def test_bitmap_offsets_and_list_values_read_without_kernels_equal_kernels() -> None:
    finals = pa.array(
        [b"ab", None, b"", b"xyz", None, b"q", None, None, b"1", b"22", b"333", None],
        type=pa.large_binary(),
    )
    for s in _slices(finals):
        valid = ~s.is_null().to_numpy(zero_copy_only=False)
        np.testing.assert_array_equal(valid_mask(s), valid)
        lengths = pa.compute.binary_length(s).fill_null(0).to_numpy(zero_copy_only=False)
        np.testing.assert_array_equal(binary_lengths(s), lengths)
    values = pa.array(np.arange(48, dtype=np.float32))
    lists = pa.FixedSizeListArray.from_arrays(values, 4)
    # A null list's slots may hold anything (NaN here): they are not the list's values.
    nan_under_nulls = pa.array(np.where(np.arange(48) // 4 % 3 == 1, np.nan, np.arange(48)))
    mask = pa.array(np.arange(12) % 3 == 1)
    holes = pa.FixedSizeListArray.from_arrays(nan_under_nulls.cast(pa.float32()), 4, mask=mask)
    for arr in (lists, holes):
        for s in _slices(arr):
            np.testing.assert_array_equal(fixed_list_values(s), s.flatten().to_numpy())
            # Every list's slots (a null list's too), as Arrow's child slice has them.
            slots = fixed_list_slots(s)
            assert slots is not None and slots.shape == (len(s), 4)
            child = s.values.slice(s.offset * 4, len(s) * 4).to_numpy(zero_copy_only=False)
            np.testing.assert_array_equal(slots.reshape(-1), child)


def test_list_slots_are_not_viewed_where_no_byte_view_exists() -> None:
    bools = pa.FixedSizeListArray.from_arrays(pa.array([True, False] * 4), 2)
    child_nulls = pa.FixedSizeListArray.from_arrays(pa.array([1.0, None, 3.0, 4.0]), 2)
    assert fixed_list_slots(bools) is None  # bit-packed
    assert fixed_list_slots(child_nulls) is None  # Arrow's conversion handles these
    assert fixed_list_slots(pa.array([1.0, 2.0])) is None  # not a list


@pytest.mark.parametrize(
    ("size", "bad"),
    [(2048, 0), (2048, 499), (2048, 500), (2048, 1001), (2048, 2047), (20_000, 19_999)],
)
def test_all_finite_finds_a_nan_or_inf_in_any_slice(size: int, bad: int) -> None:
    values = np.ones(size, np.float32)
    assert all_finite(values)
    values[bad] = np.nan
    assert not all_finite(values)
    values[bad] = -np.inf
    assert not all_finite(values.reshape(-1, 16))
