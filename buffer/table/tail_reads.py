"""The open tail's large columns, read from its WAL stripe files instead of a copy in RAM.

Every appended row is written once into the WAL (page cache, then disk). A second copy of
its camera frames in the hot tier would be fresh anonymous memory, which the kernel
zero-fills before the copy lands (a large share of the durable append's time). So the open
tail keeps only its small columns (under a page per row: states, actions)
in RAM; a large column's rows are read with ``pread`` from the record that holds them, at
the offset noted when it was written (:func:`buffer.files.encoding.ipc_message`), as a sealed
segment's are (``buffer.files.sealed.WalSegment``). Once sealed, the chunk is a cold chunk like
any other, and the prefetch thread promotes it into RAM when sampling makes it hot.

The reader holds its own read-only descriptors of the tail's files, opened when the tail is,
so a seal's rename or a WAL rotation does not disturb reads, and a reader that still holds
it (a sample in flight) reads the same inodes; they close when it is garbage.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from buffer.errors import CorruptDataError
from buffer.files import row_reads
from buffer.files.sealed import values_offset
from buffer.files.wal import scan_wal


class WalTailReader:
    """Rows ``first_row + i`` of the fixed-size-list columns ``names``, read from the WAL
    stripe files ``paths`` (stripe ``s`` is ``paths[s]``).

    The record table (one int64 row per record: local first row, stripe, rows, the file
    offset of each column's row 0 values) is appended to by the writing threads and sorted
    when a read finds it grown. Only rows whose records were added may be read (the buffer
    publishes a row after its record is written and added).

    Raises (on construction):
        OSError: a file could not be opened.
    """

    def __init__(self, paths: Sequence[Path], first_row: int, names: Sequence[str]) -> None:
        self.first_row = first_row
        self.names = list(names)
        self._column = {k: 3 + i for i, k in enumerate(self.names)}
        self._paths = [str(p) for p in paths]
        fds: list[int] = []
        try:
            for p in self._paths:
                fds.append(os.open(p, os.O_RDONLY | os.O_CLOEXEC))
        except BaseException:
            _close(fds)
            raise
        self._fds = fds
        weakref.finalize(self, _close, fds)
        self._recs: list[tuple[int, ...]] = []
        self._sorted: tuple[int, np.ndarray] = (0, np.empty((0, 3 + len(self.names)), np.int64))

    def add(self, first_row: int, stripe: int, n: int, offsets: Sequence[int]) -> None:
        """Note a written record of ``n`` rows from ``first_row`` in stripe ``stripe`` whose
        columns' row 0 values are at file ``offsets`` (in ``names`` order)."""
        self._recs.append((first_row - self.first_row, stripe, n, *offsets))

    def add_parsed(
        self, first_row: int, stripe: int, start: int, length: int, schema: pa.Schema
    ) -> None:
        """:meth:`add` for a record whose offsets are not known: its ``length``-byte message
        at file offset ``start`` is read back and parsed.

        Raises:
            CorruptDataError: the message does not read back or parse.
        """
        raw = os.pread(self._fds[stripe], length, start)
        if len(raw) != length:
            raise CorruptDataError(f"{self._paths[stripe]}: short read of a record just written")
        buf = pa.py_buffer(raw)
        batch = ipc.read_record_batch(buf, schema)
        offsets = [start + values_offset(batch.column(k), buf.address) for k in self.names]
        self.add(first_row, stripe, batch.num_rows, offsets)

    @classmethod
    def scan(
        cls,
        paths: Sequence[Path],
        first_row: int,
        names: Sequence[str],
        schema: pa.Schema,
        end: int,
    ) -> WalTailReader:
        """A reader of the records of rows below ``end`` found in the files (after the WAL
        was cut back or rewritten by a recovery: offsets may have moved).

        Raises:
            OSError, CorruptDataError: a file could not be read or parsed.
        """
        reader = cls(paths, first_row, names)
        for stripe, p in enumerate(paths):
            for rec in scan_wal(p).records:
                if first_row <= rec.first_row < end:
                    start = rec.end - len(rec.payload)
                    reader.add_parsed(rec.first_row, stripe, start, len(rec.payload), schema)
        return reader

    def _table(self) -> np.ndarray:
        n, table = self._sorted
        recs = self._recs
        k = len(recs)
        if k != n:
            t = np.array(recs[:k], dtype=np.int64).reshape(k, -1)
            table = t[np.argsort(t[:, 0], kind="stable")]
            self._sorted = (k, table)  # one assignment: readers see either table whole
        return table

    def read_rows(
        self,
        name: str,
        rows: np.ndarray,
        out: np.ndarray,
        at: np.ndarray | None = None,
        then: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> np.ndarray | None:
        """Copy local ``rows`` of column ``name`` into ``out`` with pread, one call per row
        (row ``i`` into ``out[at[i]]``, or ``out[i]`` when ``at`` is None); ``then``: also
        each row's successor, in the same call (:func:`buffer.files.row_reads.read_rows`).

        Raises:
            CorruptDataError: a row has no record, or a read came back short.
        """
        column = self._column[name]
        return row_reads.read_rows(
            self._table(), 2, column, self._fds, self._paths, name, rows, out, at, then
        )


def _close(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
