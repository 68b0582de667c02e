"""A chunk of payload rows (hot arrays in RAM, or cold: read from its segment) and the
arrays a gather fills; the tiers that hold chunks are ``buffer.table.storage``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from buffer.files.sealed import WalSegment
from buffer.files.segments import MappedSegment
from buffer.table.features import FINAL_PREFIX
from buffer.table.schema import StepSchema
from buffer.table.tail_reads import WalTailReader

Segment = MappedSegment | WalSegment


def out_arrays(specs: dict[str, tuple[tuple[int, ...], np.dtype[Any]]]) -> dict[str, np.ndarray]:
    """Uninitialized arrays carved from ONE allocation (64-byte aligned views).

    One block instead of one per column keeps a batch's memory in a single malloc region
    that the allocator reuses from call to call, instead of fresh pages (and page faults)
    for each column of each batch.
    """
    sizes = {}
    total = 0
    for k, (shape, dtype) in specs.items():
        sizes[k] = total
        total += (math.prod(shape) * dtype.itemsize + 63) // 64 * 64
    block = np.empty(total + 64, dtype=np.uint8)
    pad = (-block.ctypes.data) % 64
    out = {}
    for k, (shape, dtype) in specs.items():
        start = pad + sizes[k]
        nbytes = math.prod(shape) * dtype.itemsize
        out[k] = block[start : start + nbytes].view(dtype).reshape(shape)
    return out


@dataclass(eq=False)
class Chunk:
    """Payload of rows ``[first_row, first_row + n)``; the tiers are described in
    ``buffer.table.storage``."""

    first_row: int
    capacity: int
    arrays: dict[str, np.ndarray]
    n: int = 0
    hot: bool = True
    sealed: bool = False
    path: Path | None = None
    mapped: Segment | None = None
    finals: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    heat: float = 0.0
    touched_bytes: int = 0
    row_bytes: int = 0
    small_row_bytes: int = 0

    @property
    def end(self) -> int:
        return self.first_row + self.n

    @property
    def resident_bytes(self) -> int:
        if not self.hot:  # its small columns, unless dropped (then read from disk too)
            return self.n * self.small_row_bytes if self.arrays else 0
        # An open tail is pre-faulted at full capacity; a sealed chunk holds n rows.
        return (self.n if self.sealed else self.capacity) * self.row_bytes


class ColdArrays(dict[str, np.ndarray]):
    """The arrays of a cold chunk: its small columns while the budget has room for them
    (empty once dropped); ``seg`` reads every other column with pread (see gather). An open
    tail's large columns are read the same way, from its WAL files."""

    def __init__(self, seg: Segment | WalTailReader) -> None:
        super().__init__()
        self.seg = seg


def decode_finals(
    schema: StepSchema, batch: pa.RecordBatch, first_row: int
) -> dict[int, dict[str, np.ndarray]]:
    """``{row: {observation name: final observation}}`` for rows that carry one."""
    out: dict[int, dict[str, np.ndarray]] = {}
    n = batch.num_rows
    for name, f in schema.observations.items():
        col = batch.column(FINAL_PREFIX + name)
        if col.null_count == n:
            continue
        valid = ~col.is_null().to_numpy(zero_copy_only=False)
        for i in np.flatnonzero(valid):
            blob = col[int(i)].as_py()
            arr = np.frombuffer(blob, dtype=f.dtype).reshape(f.shape).copy()
            out.setdefault(first_row + int(i), {})[name] = arr
    return out
