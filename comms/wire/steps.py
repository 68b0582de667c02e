"""Step batches on the wire: Arrow IPC stream bytes, validated before they reach a sink.

The buffer owns the full step schema; the transport only needs ``robot_id`` (who produced the
rows: the robot's id from enrollment, as the buffer's decimal string or as an integer; checked
against the caller), ``seq`` (the robot's increasing step counter: the sink de-duplicates and
orders by it, acks carry the highest durable one) and, when present, ``run_id`` (checked
against the stream's run).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from buffer.columns import numpy_view, single_value

NO_SEQ = -1
"""The ``seq`` of no step: a robot's durable seq before the sink stored any of its rows."""


class StepFormatError(ValueError):
    """The bytes are not an Arrow IPC stream of valid step rows."""


class ForeignRowsError(PermissionError):
    """A batch holds rows of another robot than the caller."""


def encode_batch(batch: pa.RecordBatch | pa.Table) -> bytes:
    """Arrow IPC stream bytes of ``batch``."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write(batch)
    return sink.getvalue().to_pybytes()


def last_seq(batch: pa.RecordBatch) -> int:
    """The highest ``seq`` of a validated batch (its last row)."""
    return int(seq_numpy(batch)[-1])


def decode_batch(
    data: bytes, robot_id: int | None = None, run_id: str | None = None
) -> pa.RecordBatch:
    """Parse and validate one step batch.

    Args:
        data: Arrow IPC stream bytes (one or more record batches of one schema).
        robot_id: when given, every row's ``robot_id`` must equal it (or ``str(robot_id)``).
        run_id: when given and the batch has a ``run_id`` column, every row must name it.

    Returns:
        One record batch with at least one row.

    Raises:
        StepFormatError: not Arrow IPC, no rows, ``robot_id``/``seq`` missing, of the wrong
            type or null, or ``seq`` not strictly increasing.
        ForeignRowsError: a row belongs to another robot or another run.
    """
    try:
        batches = list(pa.ipc.open_stream(pa.py_buffer(data)))
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as exc:
        raise StepFormatError(f"step batch is not an Arrow IPC stream: {exc}") from None
    if not batches:
        raise StepFormatError("step batch has no rows")
    # One record batch (the usual case) is used as it is: views of ``data``, no copy.
    if len(batches) == 1:
        batch = batches[0]
    else:  # a stream has one schema, so these concatenate
        table = pa.Table.from_batches(batches)
        if table.num_rows == 0:
            raise StepFormatError("step batch has no rows")
        batch = table.combine_chunks().to_batches()[0]
    if batch.num_rows == 0:
        raise StepFormatError("step batch has no rows")
    schema = batch.schema
    names = schema.names
    cols: dict[str, pa.Array] = {}
    for col in ("robot_id", "seq"):
        if names.count(col) != 1:
            what = "lacks the" if col not in names else "has more than one"
            raise StepFormatError(f"step batch {what} {col!r} column")
        arr = batch.column(names.index(col))
        t = arr.type
        ok = pa.types.is_integer(t) or (col == "robot_id" and pa.types.is_string(t))
        if not ok:
            raise StepFormatError(f"column {col!r} must be an integer, got {t}")
        if arr.null_count:
            raise StepFormatError(f"column {col!r} has nulls")
        cols[col] = arr
    # Checks on zero-copy numpy views and bytes: a few microseconds a batch, where each Arrow
    # compute call costs ~5-15 us of Python wrapper and releases the GIL, which the server's
    # other threads then hold (profiled on the upload path).
    seq = numpy_view(cols["seq"])
    if len(seq) > 1 and not bool((seq[1:] > seq[:-1]).all()):
        raise StepFormatError("seq must be strictly increasing within a step batch")
    if robot_id is not None:
        rid = cols["robot_id"]
        if pa.types.is_string(rid.type):
            same = _all_equal(rid, str(robot_id))
        else:
            same = bool((numpy_view(rid) == robot_id).all())
        if not same:
            raise ForeignRowsError(f"step batch holds rows of another robot than {robot_id}")
    if run_id is not None and "run_id" in names and not _all_equal(batch.column("run_id"), run_id):
        raise ForeignRowsError(f"step batch holds rows of another run than {run_id!r}")
    return batch


def _all_equal(arr: pa.Array, value: str) -> bool:
    """Every row of the string column ``arr`` is ``value`` (a null is not)."""
    one = single_value(arr)  # the usual batch: one robot, one run; no kernel
    if one is not None:
        return one == value
    return bool(pc.equal(arr, value).true_count == len(arr))


def seq_numpy(batch: pa.RecordBatch) -> np.ndarray:
    """The ``seq`` column of a validated batch as a read-only numpy view (no copy), shape
    ``(rows,)``, its integer dtype."""
    return numpy_view(batch.column("seq"))
