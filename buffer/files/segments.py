"""Sealed segments: immutable Arrow IPC files, written atomically, read through mmap.

A segment ``seg-<first_row:016d>-<num_rows:010d>.arrow`` holds rows
``[first_row, first_row + num_rows)`` as ONE record batch, so each column is one contiguous
buffer that numpy can view without copying. Writing goes to a ``.tmp`` file that is fsynced,
renamed into place and followed by an fsync of the directory: a segment either exists whole
or not at all. The schema metadata carries the buffer format version (``buffer.files.format``).
"""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from buffer.errors import CorruptDataError, UnsupportedFormatError
from buffer.files import row_reads
from buffer.files.descriptors import DESCRIPTORS, new_key
from buffer.files.format import FORMAT_VERSION, SEGMENT_VERSION_KEY, SUPPORTED_FORMAT_VERSIONS
from foundation.durable import fsync_file, replace_durably

SEGMENT_GLOB = "seg-*.arrow"


def segment_name(first_row: int, num_rows: int) -> str:
    return f"seg-{first_row:016d}-{num_rows:010d}.arrow"


def parse_segment_name(path: Path) -> tuple[int, int] | None:
    parts = path.stem.split("-")
    if len(parts) != 3 or parts[0] != "seg":
        return None
    try:
        return int(parts[1]), int(parts[2])
    except ValueError:
        return None


def list_segments(directory: Path) -> Iterator[tuple[int, int, Path]]:
    found = []
    for p in directory.glob(SEGMENT_GLOB):
        parsed = parse_segment_name(p)
        if parsed is not None:
            found.append((parsed[0], parsed[1], p))
    yield from sorted(found)


def write_segment(directory: Path, first_row: int, batch: pa.RecordBatch) -> Path:
    """Write ``batch`` as a segment atomically (temp file, fsync, rename, fsync dir)."""
    final = directory / segment_name(first_row, batch.num_rows)
    tmp = final.with_suffix(".arrow.tmp")
    meta = dict(batch.schema.metadata or {})
    meta[SEGMENT_VERSION_KEY] = str(FORMAT_VERSION).encode()
    batch = batch.replace_schema_metadata(meta)
    with pa.OSFile(str(tmp), "wb") as sink:
        with ipc.new_file(sink, batch.schema) as writer:
            writer.write_batch(batch)
    fsync_file(tmp)
    replace_durably(tmp, final)
    return final


class MappedSegment:
    """A segment file memory-mapped read-only; columns are zero-copy numpy views.

    Touching a view faults pages into this process (they count in its RSS as file pages);
    :meth:`release_pages` drops them again (``MADV_DONTNEED``; the kernel re-reads them from
    the page cache or disk on the next touch), which is how the cold tier stays in budget.
    """

    def __init__(self, path: Path, expected_rows: int | None = None) -> None:
        self.path = path
        self._key = new_key()  # of its descriptor (``buffer.files.descriptors``)
        self.file_bytes = path.stat().st_size
        self._offsets: dict[str, int] = {}
        with open(path, "rb") as f:
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            reader = ipc.open_file(pa.py_buffer(self._mm))
            version = (reader.schema.metadata or {}).get(SEGMENT_VERSION_KEY, b"1")  # none: v1
            if version not in {str(v).encode() for v in SUPPORTED_FORMAT_VERSIONS}:
                raise UnsupportedFormatError(
                    path,
                    f"version {version.decode('ascii', 'replace')}",
                    SUPPORTED_FORMAT_VERSIONS,
                )
            if reader.num_record_batches != 1:
                raise CorruptDataError(f"{path}: expected one record batch")
            self.batch = reader.get_batch(0)
        except (pa.ArrowInvalid, OSError) as exc:
            raise CorruptDataError(f"{path}: not a readable Arrow segment: {exc}") from None
        if expected_rows is not None and self.batch.num_rows != expected_rows:
            raise CorruptDataError(
                f"{path}: holds {self.batch.num_rows} rows, its name says {expected_rows}"
            )

    @property
    def num_rows(self) -> int:
        return int(self.batch.num_rows)

    @property
    def paths(self) -> list[Path]:
        return [self.path]

    def batches(self) -> list[tuple[int, pa.RecordBatch]]:
        """``(offset 0, the one record batch)``: same shape as ``WalSegment.batches``."""
        return [(0, self.batch)]

    def scalar_batch(self, names: list[str]) -> pa.RecordBatch:
        return self.batch.select(names)

    def column_copy(self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        return self.column_view(name, shape, dtype).copy()

    def read_column(self, name: str, out: np.ndarray) -> None:
        """Fill ``out`` with the whole column by reading the file (not through the map)."""
        with open(self.path, "rb") as f:
            f.seek(self.column_offset(name))
            f.readinto(memoryview(out.reshape(-1)).cast("B"))

    def column_view(self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        """Zero-copy ``(num_rows, *shape)`` view of a fixed-size-list column."""
        col = self.batch.column(name)
        values = col.values.slice(col.offset * col.type.list_size, len(col) * col.type.list_size)
        arr = values.to_numpy(zero_copy_only=True)
        if arr.dtype != dtype:
            raise CorruptDataError(f"{self.path}: column {name} has dtype {arr.dtype}")
        return arr.reshape((len(col), *shape))

    def column_offset(self, name: str) -> int:
        """Byte offset in the file of the values of fixed-size-list column ``name``."""
        off = self._offsets.get(name)
        if off is None:
            col = self.batch.column(name)
            values = col.values
            width = values.type.byte_width
            buf = values.buffers()[1]
            base = pa.py_buffer(self._mm).address
            off = (
                int(buf.address - base) + (values.offset + col.offset * col.type.list_size) * width
            )
            self._offsets[name] = off
        return off

    def read_rows(
        self,
        name: str,
        rows: np.ndarray,
        out: np.ndarray,
        at: np.ndarray | None = None,
        then: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> np.ndarray | None:
        """Copy rows of a fixed-size-list column into ``out`` with pread, not through the map
        (row ``i`` into ``out[at[i]]``, or ``out[i]`` when ``at`` is None); ``then``: also
        each row's successor, in the same call (:func:`buffer.files.row_reads.read_rows`).

        Touching the mapping would fault whole page-cache folios into this process (hundreds
        of KiB per row on kernels with large folios), which the memory budget cannot afford;
        pread copies exactly the row.
        """
        # The column is one record of all the segment's rows.
        table = np.array([[0, 0, self.batch.num_rows, self.column_offset(name)]], dtype=np.int64)
        with DESCRIPTORS.open(self._key, str(self.path)) as fd:
            return row_reads.read_rows(
                table, 2, 3, [fd], [str(self.path)], name, rows, out, at, then
            )

    def read_finals(self, name: str, rows: np.ndarray) -> list[bytes | None]:
        """The ``large_binary`` column ``name`` at local ``rows`` (None: no value); read
        through the map, then its pages are released (version-1 segments only)."""
        col = self.batch.column(name)
        out = [col[int(r)].as_py() for r in rows.tolist()]
        self.release_pages()
        return out

    def close_files(self) -> None:
        """Close the descriptor its reads left open (the segment is being deleted)."""
        DESCRIPTORS.forget([self._key])

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter exit the module may be gone
            self.close_files()

    def release_pages(self) -> None:
        self._mm.madvise(mmap.MADV_DONTNEED)

    def prefetch_pages(self) -> None:
        """Hint the kernel to read the file ahead (page cache only; not resident here)."""
        self._mm.madvise(mmap.MADV_WILLNEED)
