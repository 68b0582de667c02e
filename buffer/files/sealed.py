"""Sealed WAL segments (format version 2): the write-ahead log files become the segment.

Each WAL record IS an Arrow IPC record batch message, so a segment is the WAL files
themselves, not a second copy of their rows: when the tail is full the WAL stripes are fdatasynced and closed (they hold
exactly rows ``[first, first + rows)`` between them) and each one is renamed to
``seg-<first:016d>-<rows:010d>-<stripe:02d>.wal`` (then the directory is fsynced). Every
byte is written once; the rename is the seal.

A segment is the set of files with the same ``first`` and ``rows``; their records, ordered
by row, must tile ``[first, first + rows)`` exactly (else :class:`CorruptDataError`). A crash
in the middle of the renames leaves some stripes under their WAL name
(``wal-<first>-<stripe>.log``); they are complete (fdatasynced before the first rename), and
recovery finishes the renames.

Reading is the same as for version-1 Arrow segments (:class:`buffer.files.segments.MappedSegment`):
files are memory-mapped, record batches are zero-copy views whose column offsets are noted,
large columns are read row by row with ``pread`` and mapped pages are released after
opening, so a cold segment costs almost no resident memory.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from buffer.columns import values_address
from buffer.errors import CorruptDataError
from buffer.files import row_reads
from buffer.files.descriptors import DESCRIPTORS, new_key
from buffer.files.wal import FILE_HEADER_BYTES, REC_HEADER, REC_MAGIC, check_marker
from foundation.durable import fsync_dir

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
    Idempotent: a retry after a failure part-way finds the files already renamed.
    The caller has made every file durable (``WriteAheadLog.rotate``/``close`` fdatasync).
    """
    out = []
    for p in wal_paths:
        stripe = int(p.stem.split("-")[2]) if p.stem.count("-") >= 2 else 0
        final = directory / sealed_name(first_row, num_rows, stripe)
        if not p.exists():
            if final.exists():  # renamed by an earlier try that failed after it
                out.append(final)
            continue
        if p.stat().st_size <= FILE_HEADER_BYTES:
            p.unlink()
            continue
        os.replace(p, final)
        out.append(final)
    fsync_dir(directory)
    return sorted(out)


class WalSegment:
    """A sealed segment of one or more WAL files, read with ``pread``.

    Same reading interface as :class:`buffer.files.segments.MappedSegment`: ``num_rows``, ``paths``,
    ``file_bytes``, :meth:`scalar_batch`, :meth:`batches`, :meth:`column_copy`,
    :meth:`read_rows`, :meth:`read_column`, :meth:`read_finals`, :meth:`release_pages`.

    What stays in memory is one small int64 table with a row per record, never per row: the
    record's first row, file and span, and the file offset of each column's values (about
    100 bytes per record of tens of rows). The files are mapped only to parse them (here, and
    again in :meth:`batches`: opening, export), not kept mapped, and no Arrow batch object is
    kept: each costs kilobytes, which at a fleet's millions of rows would be most of the
    buffer's memory outside its budget.

    Raises (on construction):
        CorruptDataError: a file is unreadable, or the records do not tile the row range.
        UnsupportedFormatError: a file's marker is another format version.
    """

    def __init__(self, paths: list[Path], first_row: int, num_rows: int, schema: pa.Schema) -> None:
        self._paths = tuple(str(p) for p in paths)
        self._key = new_key()  # of its descriptors (``buffer.files.descriptors``)
        self.first_row = first_row
        self.num_rows = num_rows
        self.file_bytes = 0
        self.schema = schema
        layout = _layout(schema)
        rows: list[list[int]] = []  # per record: first, file, start, length, n, offsets...
        for fi, p in enumerate(paths):
            with open(p, "rb") as f:
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            try:
                self.file_bytes += len(mm)
                base = pa.py_buffer(mm).address
                for row, start, length, batch in _records(p, mm, schema):
                    rows.append(
                        [row, fi, start, length, batch.num_rows, *layout.offsets(batch, base)]
                    )
                    del batch  # nothing may keep a view of the map past its close
            finally:
                with contextlib.suppress(BufferError):  # a parse error's traceback holds a view
                    mm.close()
        rows.sort(key=lambda r: r[0])
        self._check_tiling(rows)
        table = np.asarray(rows, dtype=np.int64).reshape(len(rows), -1)
        table[:, 0] -= first_row
        self._table = table
        self._layout = layout

    def _check_tiling(self, rows: list[list[int]]) -> None:
        """The records, in row order, must cover ``[first_row, first_row + num_rows)``.

        Raises:
            CorruptDataError: a gap, an overlap or another row count than the name's.
        """
        expect = self.first_row
        for row, fi, _, _, n, *_ in rows:
            if row != expect:
                raise CorruptDataError(
                    f"{self._paths[fi]}: records do not tile rows [{self.first_row}, "
                    f"{self.first_row + self.num_rows}): found row {row}, expected {expect}"
                )
            expect += n
        if expect != self.first_row + self.num_rows:
            raise CorruptDataError(
                f"{self._paths[0]}: segment holds rows [{self.first_row}, {expect}), its name "
                f"says {self.num_rows} rows"
            )

    @property
    def paths(self) -> list[Path]:
        return [Path(p) for p in self._paths]

    @property
    def path(self) -> Path:
        return Path(self._paths[0])

    # -- metadata ------------------------------------------------------------------------
    def batches(self) -> list[tuple[int, pa.RecordBatch]]:
        """``(local first row, record batch)`` of every record in row order, parsed from a
        fresh read-only map of each file (zero-copy views that keep the map alive)."""
        maps: dict[int, pa.Buffer] = {}
        out = []
        for first, fi, start, length in self._table[:, :4].tolist():
            if fi not in maps:
                with open(self._paths[fi], "rb") as f:
                    maps[fi] = pa.py_buffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
            out.append((first, ipc.read_record_batch(maps[fi].slice(start, length), self.schema)))
        return out

    def scalar_batch(self, names: list[str]) -> pa.RecordBatch:
        """Columns ``names`` of all rows as one record batch (copies only those columns)."""
        parts = [b.select(names) for _, b in self.batches()]
        return pa.Table.from_batches(parts).combine_chunks().to_batches()[0]

    # -- reading -------------------------------------------------------------------------
    def column_copy(self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        """The whole column ``(num_rows, *shape)`` copied into RAM (read with pread)."""
        out = np.empty((self.num_rows, *shape), dtype=dtype)
        self.read_column(name, out)
        return out

    @contextlib.contextmanager
    def _files(self, fis: Iterable[int]) -> Iterator[dict[int, int]]:
        """Read-only descriptors of the segment's files ``fis`` (``buffer.files.descriptors``)."""
        entries = [(fi, DESCRIPTORS.acquire((self._key, fi), self._paths[fi])) for fi in set(fis)]
        try:
            yield {fi: e.fd for fi, e in entries}
        finally:
            for _, e in entries:
                DESCRIPTORS.release(e)

    def _rec(self, rows: np.ndarray) -> np.ndarray:
        """The record holding each local row."""
        return np.searchsorted(self._table[:, 0], rows, side="right") - 1

    def read_rows(
        self,
        name: str,
        rows: np.ndarray,
        out: np.ndarray,
        at: np.ndarray | None = None,
        then: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> np.ndarray | None:
        """Copy local ``rows`` of column ``name`` into ``out`` with pread (row ``i`` into
        ``out[at[i]]``, or ``out[i]`` when ``at`` is None); ``then``: also each row's
        successor, in the same call (:func:`buffer.files.row_reads.read_rows`)."""
        t = self._table
        files = t[self._rec(rows).clip(0), 1].tolist()
        with self._files(files) as fds:
            return row_reads.read_rows(
                t, 4, self._layout.column[name], fds, self._paths, name, rows, out, at, then
            )

    def read_column(self, name: str, out: np.ndarray) -> None:
        """Fill ``out`` (``(num_rows, ...)``) with column ``name``, one pread per record."""
        flat = out.reshape(self.num_rows, -1).view(np.uint8)
        nbytes = flat.shape[1]
        t = self._table
        ends = np.append(t[1:, 0], self.num_rows)
        offs = t[:, self._layout.column[name]]
        files = t[:, 1].tolist()
        with self._files(files) as fds:
            for i, (a, b) in enumerate(zip(t[:, 0].tolist(), ends.tolist(), strict=True)):
                fi = files[i]
                dst = memoryview(flat[a:b].reshape(-1))
                if os.preadv(fds[fi], [dst], int(offs[i])) != (b - a) * nbytes:
                    raise CorruptDataError(f"{self._paths[fi]}: short read of {name}")

    def read_finals(self, name: str, rows: np.ndarray) -> list[bytes | None]:
        """The ``large_binary`` column ``name`` (a final observation) at local ``rows``: the
        value's bytes, or None where the row has none (a null is stored with length 0, and
        validation refuses an empty final observation). Two preads per row."""
        out: list[bytes | None] = []
        t = self._table
        col, data = self._layout.column[name], self._layout.data[name]
        recs = self._rec(rows).tolist()
        with self._files(int(t[k, 1]) for k in recs) as fds:
            for r, k in zip(rows.tolist(), recs, strict=True):
                fi = int(t[k, 1])
                raw = os.pread(fds[fi], 16, int(t[k, col]) + 8 * (r - int(t[k, 0])))
                if len(raw) != 16:
                    raise CorruptDataError(f"{self._paths[fi]}: short read of {name} offsets")
                a, b = struct.unpack("<qq", raw)
                if b <= a:
                    out.append(None)
                    continue
                value = os.pread(fds[fi], b - a, int(t[k, data]) + a)
                if len(value) != b - a:
                    raise CorruptDataError(f"{self._paths[fi]}: short read of {name}")
                out.append(value)
        return out

    def release_pages(self) -> None:
        """Nothing is kept mapped (reads are preads)."""

    def close_files(self) -> None:
        """Close the descriptors its reads left open (the segment is being deleted)."""
        DESCRIPTORS.forget((self._key, fi) for fi in range(len(self._paths)))

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter exit the module may be gone
            self.close_files()


class _Layout:
    """Where each column's offset sits in a segment's record table, per step schema.

    ``column[name]``: the table column holding the file offset of a fixed-size-list
    column's row 0 values, or of a ``large_binary`` column's row 0 offset; ``data[name]``:
    that of a ``large_binary`` column's data buffer.
    """

    def __init__(self, schema: pa.Schema) -> None:
        self.fixed = [f.name for f in schema if pa.types.is_fixed_size_list(f.type)]
        self.binary = [f.name for f in schema if pa.types.is_large_binary(f.type)]
        first = 5  # first, file, start, length, rows
        self.column = {k: first + i for i, k in enumerate(self.fixed + self.binary)}
        after = first + len(self.column)
        self.data = {k: after + i for i, k in enumerate(self.binary)}

    def offsets(self, batch: pa.RecordBatch, base: int) -> list[int]:
        """The offsets of one record's batch mapped at ``base``, in table order."""
        fixed = [values_offset(batch.column(k), base) for k in self.fixed]
        binary = [_binary_offsets(batch.column(k), base) for k in self.binary]
        return fixed + [o for o, _ in binary] + [d for _, d in binary]


_LAYOUTS: dict[str, _Layout] = {}


def _layout(schema: pa.Schema) -> _Layout:
    key = schema.to_string(show_schema_metadata=False)
    found = _LAYOUTS.get(key)
    if found is None:
        found = _LAYOUTS[key] = _Layout(schema)
    return found


def _records(
    path: Path, mm: mmap.mmap, schema: pa.Schema
) -> Iterable[tuple[int, int, int, pa.RecordBatch]]:
    """``(first row, message start, message length, batch)`` of each record of a sealed
    file, in file order.

    Raises:
        CorruptDataError: no WAL header, or a record that does not parse.
    """
    buf = pa.py_buffer(mm)
    if not check_marker(path, bytes(mm[:8])) or len(mm) < FILE_HEADER_BYTES:
        raise CorruptDataError(f"{path}: sealed segment file has no WAL header")
    pos = FILE_HEADER_BYTES
    while pos < len(mm):
        if pos + REC_HEADER.size > len(mm):
            raise CorruptDataError(f"{path}: truncated record header at byte {pos}")
        magic, length, row, _crc = REC_HEADER.unpack_from(mm, pos)
        start = pos + REC_HEADER.size
        if magic != REC_MAGIC or start + length > len(mm):
            raise CorruptDataError(f"{path}: bad record at byte {pos}")
        try:
            batch = ipc.read_record_batch(buf.slice(start, length), schema)
        except (pa.ArrowInvalid, OSError) as exc:
            raise CorruptDataError(f"{path}: unreadable record at byte {pos}: {exc}") from None
        yield row, start, length, batch
        pos = start + length


def values_offset(col: pa.FixedSizeListArray, base: int) -> int:
    """File offset of row 0's values of a fixed-size-list column mapped at ``base``."""
    return values_address(col) - base


def _binary_offsets(col: pa.LargeBinaryArray, base: int) -> tuple[int, int]:
    """File offsets of row 0's int64 offset and of the data buffer of a ``large_binary``
    column mapped at ``base`` (the data offset is where value offset 0 points)."""
    _, offsets, data = col.buffers()
    at = int(offsets.address - base) + 8 * col.offset
    return at, (int(data.address - base) if data is not None else 0)
