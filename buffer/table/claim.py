"""What one append carries through the parts of the writer (``buffer.table.writer``): its
:class:`Claim` on rows and, once durable, its :class:`AppendResult`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from buffer.columns import StepColumns
from buffer.files.wal import WriteAheadLog
from buffer.table.chunks import Chunk


@dataclass
class Claim:
    """One append's new records on their way to disk."""

    new: pa.RecordBatch
    cols: StepColumns  # the small columns of ``new``
    wal: WriteAheadLog  # its stripe
    dup: np.ndarray | None = None  # which records of the validated batch were stored before
    recoveries: int = 0  # ``Writer.recoveries`` when it was de-duplicated
    limited: int = 0  # inserts counted by the rate limiter and not yet stored
    announced: bool = True  # its WAL stripe still expects its record (``WriteAheadLog.begin``)
    counted: bool = False  # counted among the appends given rows (``Writer.claimed``)
    first: int = 0
    end: int = 0
    tail: Chunk | None = None


@dataclass(frozen=True)
class AppendResult:
    """What an append made durable (returned only after fdatasync).

    Attributes:
        acked: robot_id -> highest seq of that robot now durable in the buffer (covers the
            records of this call, stored now or earlier).
        stored: records newly stored by this call.
        duplicates: records already stored before (acknowledged, not stored again).
        rows: global row range ``[first, end)`` given to the new records.
    """

    acked: dict[str, int]
    stored: int
    duplicates: int
    rows: tuple[int, int]
