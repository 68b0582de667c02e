"""Sealed WAL segments (format version 2): the write-ahead log files become the segment.

Sealing used to copy every row a second time, from the WAL into an Arrow IPC file. Each WAL
record already IS an Arrow IPC record batch message, so a segment is now the WAL files
themselves: when the tail is full the WAL stripes are fdatasynced and closed (they hold
exactly rows ``[first, first + rows)`` between them) and each one is renamed to
``seg-<first:016d>-<rows:010d>-<stripe:02d>.wal`` (then the directory is fsynced). Every
byte is written once; the rename is the seal.

A segment is the set of files with the same ``first`` and ``rows``; their records, ordered
by row, must tile ``[first, first + rows)`` exactly (else :class:`CorruptDataError`). A crash
in the middle of the renames leaves some stripes under their WAL name
(``wal-<first>-<stripe>.log``); they are complete (fdatasynced before the first rename), and
recovery finishes the renames.

Reading is the same as for version-1 Arrow segments (:class:`buffer.segments.MappedSegment`):
files are memory-mapped, record batches are zero-copy views whose column offsets are noted,
large columns are read row by row with ``pread`` and mapped pages are released after
opening, so a cold segment costs almost no resident memory.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from buffer.errors import CorruptDataError
from buffer.wal import FILE_HEADER_BYTES, REC_HEADER, REC_MAGIC, check_marker
from robofleet.durable import fsync_dir

SEALED_GLOB = "seg-*-*-*.wal"


def sealed_name(first_row: int, num_rows: int, stripe: int) -> str:
    return f"seg-{first_row:016d}-{num_rows:010d}-{stripe:02d}.wal"


def parse_sealed_name(path: Path) -> tuple[int, int, int] | None:
    """``(first_row, num_rows, stripe)`` of a sealed WAL file name, or None."""
    parts = path.name.removesuffix(".wal").split("-")
    if len(parts) != 4 or parts[0] != "seg" or not path.name.endswith(".wal"):
        return None
    try:
        return int(parts[1]), int(parts[2]), int(parts[3])
    except ValueError:
        return None


def list_sealed(directory: Path) -> dict[tuple[int, int], list[Path]]:
    """Sealed WAL files grouped by segment ``(first_row, num_rows)``."""
    out: dict[tuple[int, int], list[Path]] = {}
    for p in sorted(directory.glob(SEALED_GLOB)):
        parsed = parse_sealed_name(p)
        if parsed is not None:
            out.setdefault(parsed[:2], []).append(p)
    return out


def seal_files(
    directory: Path, first_row: int, num_rows: int, wal_paths: Iterable[Path]
) -> list[Path]:
    """Turn closed, fdatasynced WAL stripe files into segment ``[first_row, +num_rows)``.

    Files that hold no record are deleted; the rest are renamed. Returns the segment's files.
    The caller has made every file durable (``WriteAheadLog.rotate``/``close`` fdatasync).
    """
    out = []
    for p in wal_paths:
        if not p.exists():
            continue
        if p.stat().st_size <= FILE_HEADER_BYTES:
            p.unlink()
            continue
        stripe = int(p.stem.split("-")[2]) if p.stem.count("-") >= 2 else 0
        final = directory / sealed_name(first_row, num_rows, stripe)
        os.replace(p, final)
        out.append(final)
    fsync_dir(directory)
    return sorted(out)


class WalSegment:
    """A sealed segment of one or more WAL files, memory-mapped read-only.

    Same reading interface as :class:`buffer.segments.MappedSegment`: ``num_rows``, ``paths``,
    ``file_bytes``, :meth:`scalar_batch`, :meth:`batches`, :meth:`column_copy`,
    :meth:`read_rows`, :meth:`read_column`, :meth:`release_pages`.

    Raises (on construction):
        CorruptDataError: a file is unreadable, or the records do not tile the row range.
        UnsupportedFormatError: a file's marker is another format version.
    """

    def __init__(self, paths: list[Path], first_row: int, num_rows: int, schema: pa.Schema) -> None:
        self.paths = list(paths)
        self.path = self.paths[0]
        self.first_row = first_row
        self.file_bytes = 0
        self._maps: list[mmap.mmap] = []
        self._fds: list[int] = []
        recs: list[tuple[int, int, pa.RecordBatch, int]] = []  # first, file, batch, base addr
        for fi, p in enumerate(self.paths):
            with open(p, "rb") as f:
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self._maps.append(mm)
            self.file_bytes += len(mm)
            buf = pa.py_buffer(mm)
            if not check_marker(p, bytes(mm[:8])) or len(mm) < FILE_HEADER_BYTES:
                raise CorruptDataError(f"{p}: sealed segment file has no WAL header")
            pos = FILE_HEADER_BYTES
            while pos < len(mm):
                if pos + REC_HEADER.size > len(mm):
                    raise CorruptDataError(f"{p}: truncated record header at byte {pos}")
                magic, length, row, _crc = REC_HEADER.unpack_from(mm, pos)
                start = pos + REC_HEADER.size
                if magic != REC_MAGIC or start + length > len(mm):
                    raise CorruptDataError(f"{p}: bad record at byte {pos}")
                try:
                    batch = ipc.read_record_batch(buf.slice(start, length), schema)
                except (pa.ArrowInvalid, OSError) as exc:
                    raise CorruptDataError(f"{p}: unreadable record at byte {pos}: {exc}") from None
                recs.append((row, fi, batch, buf.address))
                pos = start + length
        recs.sort(key=lambda r: r[0])
        expect = first_row
        for row, fi, batch, _ in recs:
            if row != expect:
                raise CorruptDataError(
                    f"{self.paths[fi]}: records do not tile rows [{first_row}, "
                    f"{first_row + num_rows}): found row {row}, expected {expect}"
                )
            expect += batch.num_rows
        if expect != first_row + num_rows:
            raise CorruptDataError(
                f"{self.path}: segment holds rows [{first_row}, {expect}), its name says "
                f"{num_rows} rows"
            )
        self.num_rows = num_rows
        self._recs = recs
        self._rec_first = np.array([r[0] - first_row for r in recs], dtype=np.int64)
        self._rec_file = np.array([r[1] for r in recs], dtype=np.int64)
        self._offsets: dict[str, np.ndarray] = {}

    # -- metadata ------------------------------------------------------------------------
    def batches(self) -> list[tuple[int, pa.RecordBatch]]:
        """``(local first row, record batch)`` of every record in row order (zero-copy)."""
        return [(r[0] - self.first_row, r[2]) for r in self._recs]

    def scalar_batch(self, names: list[str]) -> pa.RecordBatch:
        """Columns ``names`` of all rows as one record batch (copies only those columns)."""
        parts = [b.select(names) for _, b in self.batches()]
        return pa.Table.from_batches(parts).combine_chunks().to_batches()[0]

    def _column_offsets(self, name: str) -> np.ndarray:
        """File offset of row 0 of each record's values of fixed-size-list column ``name``."""
        off = self._offsets.get(name)
        if off is None:
            vals = []
            for _row, _fi, batch, base in self._recs:
                col = batch.column(name)
                values = col.values
                buf = values.buffers()[1]
                width = values.type.byte_width
                vals.append(
                    int(buf.address - base)
                    + (values.offset + col.offset * col.type.list_size) * width
                )
            off = self._offsets[name] = np.asarray(vals, dtype=np.int64)
        return off

    # -- reading -------------------------------------------------------------------------
    def column_copy(self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        """The whole column ``(num_rows, *shape)`` copied into RAM (touches its pages)."""
        out = np.empty((self.num_rows, *shape), dtype=dtype)
        pos = 0
        for _, batch in self.batches():
            col = batch.column(name)
            n = len(col)
            values = col.values.slice(col.offset * col.type.list_size, n * col.type.list_size)
            arr = values.to_numpy(zero_copy_only=True)
            if arr.dtype != dtype:
                raise CorruptDataError(f"{self.path}: column {name} has dtype {arr.dtype}")
            out[pos : pos + n] = arr.reshape((n, *shape))
            pos += n
        return out

    def _fd(self, fi: int) -> int:
        while len(self._fds) <= fi:
            self._fds.append(-1)
        if self._fds[fi] < 0:
            self._fds[fi] = os.open(self.paths[fi], os.O_RDONLY)
        return self._fds[fi]

    def read_rows(self, name: str, rows: np.ndarray, out: np.ndarray) -> None:
        """Copy local ``rows`` of column ``name`` into ``out`` with pread (not via the map)."""
        flat = out.reshape(len(rows), -1).view(np.uint8)
        nbytes = flat.shape[1]
        offs = self._column_offsets(name)
        rec = np.searchsorted(self._rec_first, rows, side="right") - 1
        pos = offs[rec] + (rows - self._rec_first[rec]) * nbytes
        files = self._rec_file[rec]
        for i, (p, fi) in enumerate(zip(pos.tolist(), files.tolist(), strict=True)):
            if os.preadv(self._fd(fi), [flat[i]], p) != nbytes:
                raise CorruptDataError(f"{self.paths[fi]}: short read of {name}")

    def read_column(self, name: str, out: np.ndarray) -> None:
        """Fill ``out`` (``(num_rows, ...)``) with column ``name``, one pread per record."""
        flat = out.reshape(self.num_rows, -1).view(np.uint8)
        nbytes = flat.shape[1]
        offs = self._column_offsets(name)
        ends = np.append(self._rec_first[1:], self.num_rows)
        for i, (a, b) in enumerate(zip(self._rec_first.tolist(), ends.tolist(), strict=True)):
            fi = int(self._rec_file[i])
            dst = memoryview(flat[a:b].reshape(-1))
            if os.preadv(self._fd(fi), [dst], int(offs[i])) != (b - a) * nbytes:
                raise CorruptDataError(f"{self.paths[fi]}: short read of {name}")

    def release_pages(self) -> None:
        for mm in self._maps:
            mm.madvise(mmap.MADV_DONTNEED)

    def __del__(self) -> None:
        for fd in getattr(self, "_fds", []):
            if fd >= 0:
                os.close(fd)
