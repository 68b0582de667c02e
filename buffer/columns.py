"""The small columns of one step batch as numpy arrays, taken out of Arrow once per append.

Validation, de-duplication, the row index and the acknowledgement all read ``seq``,
``robot_id``, the episode columns and the flags. Each ``pyarrow`` call costs microseconds of
interpreter time under the GIL, so asking the batch again in every part cost more than the
checks themselves; :func:`StepColumns.of` does it once (one ``dictionary_encode`` per string
column: a batch usually holds one robot, one run and one task).

The usual columns (no nulls) are read as numpy views of their Arrow buffers
(:func:`numpy_view`), not with ``to_numpy``: pyarrow's conversions and compute kernels release
the GIL, and the buffer's appends are staged one at a time by one thread (``buffer.table.combiner``)
while the other appending threads wait on I/O; each release lets one of them take the GIL,
and the stager waits to get it back (staging then takes a multiple of its CPU time).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

NUMERIC = (
    "seq",
    "episode_index",
    "frame_index",
    "timestamp",
    "reward",
    "terminated",
    "truncated",
    "is_intervention",
    "policy_version",
)
STRINGS = ("robot_id", "run_id", "task")


@dataclass(frozen=True)
class Strings:
    """A string column dictionary-encoded: ``names[codes[i]]`` is row ``i``'s value.

    Attributes:
        names: the distinct values, in first-seen order.
        codes: int32 ``(n,)`` positions into ``names``.
    """

    names: list[str]
    codes: np.ndarray

    @classmethod
    def of(cls, arr: pa.Array) -> Strings:
        """Encode a ``string`` array without nulls."""
        one = single_value(arr)
        if one is not None:  # the usual batch: one value, no compute kernel
            return cls([one], np.zeros(len(arr), dtype=np.int32))
        enc = pc.dictionary_encode(arr)
        names = [str(v) for v in enc.dictionary.to_pylist()]
        codes = enc.indices.to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
        return cls(names, codes)

    @property
    def single(self) -> bool:
        """Every row holds the same value."""
        return len(self.names) == 1

    def value(self, row: int) -> str:
        return self.names[int(self.codes[row])]

    def byte_lengths(self) -> np.ndarray:
        """UTF-8 byte length of each row's value, int64 ``(n,)``."""
        per_name = np.array([len(s.encode()) for s in self.names], dtype=np.int64)
        return per_name[self.codes] if len(self.codes) else np.zeros(0, np.int64)

    def take(self, rows: np.ndarray) -> Strings:
        return Strings(self.names, self.codes[rows])


def numpy_view(arr: pa.Array) -> np.ndarray:
    """A fixed-width numeric or boolean ``arr`` as numpy ``(len(arr),)`` without a GIL release:
    a read-only view of its data buffer (booleans: unpacked from their bits, a copy); an
    array with nulls or of another type goes through ``to_numpy`` (nulls become NaN or
    objects, as pyarrow does)."""
    dtype = _FIXED_WIDTH.get(arr.type.id)
    if dtype is None or arr.null_count:
        return arr.to_numpy(zero_copy_only=False)
    n = len(arr)
    data = arr.buffers()[1]
    if dtype.kind == "b":
        return _bits(data, arr.offset, n)
    return np.frombuffer(data, dtype=dtype, count=n, offset=arr.offset * dtype.itemsize)


# Arrow type id -> numpy dtype of the fixed-width types numpy_view reads as views (a dict
# lookup: pyarrow's ``types.is_*`` helpers cost microseconds per column per append).
_FIXED_WIDTH = {
    t.id: np.dtype(t.to_pandas_dtype())
    for t in (
        pa.int8(), pa.int16(), pa.int32(), pa.int64(),
        pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64(),
        pa.float16(), pa.float32(), pa.float64(), pa.bool_(),
    )
}  # fmt: skip


def valid_mask(arr: pa.Array) -> np.ndarray:
    """bool ``(len(arr),)``: True where ``arr`` holds a value (not null), read from its
    validity bitmap without a GIL release (see the module docstring)."""
    n = len(arr)
    if not arr.null_count:
        return np.ones(n, dtype=bool)
    if arr.null_count == n:
        return np.zeros(n, dtype=bool)
    return _bits(arr.buffers()[0], arr.offset, n)


def _bits(buf: pa.Buffer, offset: int, n: int) -> np.ndarray:
    """bool ``(n,)``: bits ``offset .. offset + n`` of an Arrow bitmap (LSB first)."""
    if n == 0:
        return np.zeros(0, dtype=bool)
    first = offset // 8
    packed = np.frombuffer(buf, dtype=np.uint8, count=(offset + n + 7) // 8 - first, offset=first)
    skip = offset - 8 * first
    return np.unpackbits(packed, count=skip + n, bitorder="little")[skip:].view(np.bool_)


def binary_lengths(arr: pa.Array, valid: np.ndarray | None = None) -> np.ndarray:
    """int64 ``(len(arr),)``: byte length of each value of a ``large_binary`` ``arr``, 0 where
    null, from its offsets buffer (no GIL release). ``valid``: ``valid_mask(arr)`` when the
    caller has it already."""
    n = len(arr)
    if n == 0 or arr.null_count == n:
        return np.zeros(n, dtype=np.int64)
    off = np.frombuffer(arr.buffers()[1], dtype=np.int64, count=n + 1, offset=arr.offset * 8)
    lens = np.diff(off)
    if not arr.null_count:
        return lens
    return np.where(valid_mask(arr) if valid is None else valid, lens, 0)


def values_address(col: pa.FixedSizeListArray) -> int:
    """Memory address of row 0's values of a fixed-size-list column of fixed-width values
    (its child's data buffer, past the child's and the column's offsets)."""
    values = col.values
    width = values.type.byte_width
    return (
        int(values.buffers()[1].address) + (values.offset + col.offset * col.type.list_size) * width
    )


def fixed_list_values(arr: pa.FixedSizeListArray) -> np.ndarray:
    """The values of a fixed-size-list ``arr`` of numbers, flat ``(valid lists * list_size,)``,
    as ``arr.flatten()`` has them (a null list's slots left out), read from the child's buffer
    (no GIL release; a read-only view when no list is null)."""
    slots = fixed_list_slots(arr)
    if slots is None:
        return arr.flatten().to_numpy(zero_copy_only=False)
    if arr.null_count:  # a null list's slots hold whatever the producer left there
        return slots[valid_mask(arr)].reshape(-1)
    return slots.reshape(-1)


def fixed_list_slots(arr: pa.Array) -> np.ndarray | None:
    """Every list's slots of a fixed-size-list ``arr`` of numbers, ``(len(arr), list_size)``,
    as a read-only view of the child's buffer (no GIL release; a null list's slots hold
    whatever the producer left there); None when ``arr`` is not such an array or its child
    has nulls (then read it with Arrow's own conversion)."""
    if not pa.types.is_fixed_size_list(arr.type):
        return None
    child = arr.values
    numeric = pa.types.is_integer(child.type) or pa.types.is_floating(child.type)
    if child.null_count or not numeric:  # booleans are bit-packed: no byte view
        return None
    size = arr.type.list_size
    dtype = np.dtype(child.type.to_pandas_dtype())
    start = child.offset + arr.offset * size
    flat = np.frombuffer(
        child.buffers()[1], dtype=dtype, count=len(arr) * size, offset=start * dtype.itemsize
    )
    return flat.reshape(len(arr), size)


def all_finite(values: np.ndarray) -> bool:
    """No NaN or Inf in the float array ``values``. A small one (a batch's states and
    actions) is checked in slices below numpy's threshold for releasing the GIL (500
    elements; see the module docstring); a large one in one pass, where the release pays."""
    flat = values.reshape(-1)
    if len(flat) > _SLICED_MAX:
        return bool(np.isfinite(flat).all())
    return all(np.isfinite(flat[i : i + 500]).all() for i in range(0, len(flat), 500))


_SLICED_MAX = 8192  # 17 slices at most


def single_value(arr: pa.Array) -> str | None:
    """The value of a ``string`` array whose rows all hold the same one, else None.

    Read from the offsets and data buffers with numpy: a compute kernel call costs more
    (it releases and retakes the GIL, which under contention is a context switch)."""
    n = len(arr)
    if n == 0 or arr.null_count or arr.type != pa.string():
        return None
    _, offsets_buf, data_buf = arr.buffers()
    off = np.frombuffer(offsets_buf, dtype=np.int32, count=n + 1, offset=arr.offset * 4)
    width = int(off[1] - off[0])
    if not (np.diff(off) == width).all():
        return None
    if width == 0:
        return ""
    # A bytes compare (memcmp under the GIL), not numpy's, which releases it past 500 bytes.
    start = int(off[0])
    data = memoryview(data_buf)[start : start + n * width]
    first = bytes(data[:width])
    if bytes(data) != first * n:
        return None  # equal total length by chance (or different values)
    return first.decode()


@dataclass(frozen=True)
class StepColumns:
    """The small columns of a batch of ``n`` steps (see the module docstring).

    Attributes:
        n: rows.
        num: ``seq``, ``episode_index``, ``frame_index``, ``policy_version`` (int64),
            ``timestamp`` (float64), ``reward`` (float32), ``terminated``, ``truncated``,
            ``is_intervention`` (bool), each ``(n,)``.
        robot, run, task: the string columns, dictionary-encoded.
    """

    n: int
    num: dict[str, np.ndarray]
    robot: Strings
    run: Strings
    task: Strings

    @classmethod
    def of(
        cls,
        batch: pa.RecordBatch,
        positions: dict[str, int] | None = None,
        columns: list[pa.Array] | None = None,
    ) -> StepColumns:
        """Read the columns of ``batch`` (it must have them, with the step schema's types);
        ``positions``: their indices in the batch, when known (faster than by name);
        ``columns``: ``batch.columns``, when the caller has them. The numeric arrays may be
        read-only views of the batch's memory."""
        pos = positions or {name: i for i, name in enumerate(batch.schema.names)}
        cols = batch.columns if columns is None else columns
        num = {k: numpy_view(cols[pos[k]]) for k in NUMERIC}
        strings = [Strings.of(cols[pos[k]]) for k in STRINGS]
        return cls(batch.num_rows, num, *strings)

    @property
    def seq(self) -> np.ndarray:
        return self.num["seq"]

    @property
    def done(self) -> np.ndarray:
        return self.num["terminated"] | self.num["truncated"]

    def take(self, rows: np.ndarray) -> StepColumns:
        """The rows ``rows`` (an int index or a bool mask), in that order."""
        num = {k: v[rows] for k, v in self.num.items()}
        n = len(next(iter(num.values())))
        return StepColumns(n, num, self.robot.take(rows), self.run.take(rows), self.task.take(rows))
