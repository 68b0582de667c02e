"""The remover (Reverb's word for the part that takes items out of a table): the catalogue of
sealed segments and the deletion of the oldest ones once they pass ``retention_max_bytes``.

Retention deletes whole segments, oldest first, never the newest; their rows leave the
storage (and so the sampling window) before their files are unlinked, and the directory is
fsynced after the unlinks. Before any unlink, each segment's robots and seqs are appended to
the directory's record (``buffer.table.retired``) and fsynced: a segment is never deleted
without its line, so a reopen still knows which acknowledged steps were stored. After the
unlinks the record may be folded (``RetiredSeqs.fold``), so it stays a few lines per robot,
and once enough rows are gone the row index drops them too (``buffer.table.compaction``).
A file whose unlink fails stays listed and is unlinked again at every deletion; until none is
left the record is not folded, because a fold would count the rows of a segment that a reopen
still finds on disk (and stores) as retired too.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from buffer.table.chunks import Segment
from buffer.table.compaction import maybe_compact
from buffer.table.state import TableState
from foundation.durable import fsync_dir

log = logging.getLogger(__name__)


class Retention:
    """Sealed segments of one directory, oldest first, with their files.

    Args:
        directory: the buffer directory.
        max_bytes: ``BufferSettings.retention_max_bytes`` (0: keep everything).
        read_only: a mounted directory is never changed.

    Not thread-safe on its own: call every method with the buffer's lock held.
    """

    def __init__(self, directory: Path, max_bytes: int, read_only: bool) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.read_only = read_only
        self.segments: list[tuple[int, int, Path]] = []  # (first row, rows, path)
        # first row -> every file of that segment, as strings (a Path object costs hundreds
        # of bytes, and a directory holds thousands of segments)
        self._files: dict[int, tuple[str, ...]] = {}
        self.undeleted: dict[int, tuple[str, ...]] = {}  # first row -> files still to unlink

    def add(self, first_row: int, num_rows: int, segment: Segment) -> None:
        """Record a segment sealed (or found on open) at ``first_row``."""
        self.segments.append((first_row, num_rows, segment.path))
        self._files[first_row] = tuple(str(p) for p in segment.paths)

    def summary(self) -> list[tuple[int, int, str]]:
        """``(first row, rows, path)`` of every segment, for ``RowIndex.summary``."""
        return [(f, n, str(p)) for f, n, p in self.segments]

    def apply(self, state: TableState) -> None:
        """Delete the oldest segments (never the last) while the sealed bytes on disk exceed
        ``max_bytes``: their rows are recorded (``state.retired``, fsynced), their chunks
        leave ``state.storage``, then their files are unlinked, and the row index drops
        the rows once enough are gone (``maybe_compact``). When the record cannot be
        written (a full disk), nothing is deleted and the next call tries again."""
        storage = state.storage
        limit = self.max_bytes
        if not limit or self.read_only:
            return
        if self.undeleted and self._unlink_undeleted():
            fsync_dir(self.directory)
        sizes = [
            sum(os.stat(f).st_size for f in self._files.get(first, (str(p),)) if os.path.exists(f))
            for first, _, p in self.segments
        ]
        total = sum(sizes)
        drop = 0
        for size in sizes[:-1]:
            if total <= limit:
                break
            total -= size
            drop += 1
        if not drop:
            return
        gone = self.segments[:drop]
        try:
            state.retired.record([(f, *_rows_of(state, f, n)) for f, n, _ in gone])
        except OSError as exc:
            log.warning("%s: retention waits, its record is not writable: %s", self.directory, exc)
            return
        self.segments = self.segments[drop:]
        paths = {p for _, _, p in gone}
        chunks = [c for c in storage.chunks if c.path in paths]
        storage.remove_chunks(chunks)
        for c in chunks:  # an open descriptor would keep the deleted file's space in use
            if c.mapped is not None:
                c.mapped.close_files()
        for first, _, p in gone:
            self.undeleted[first] = self._files.pop(first, (str(p),))
        self._unlink_undeleted()
        fsync_dir(self.directory)
        try:  # only now: a folded record no longer names the segments just deleted
            if not self.undeleted:
                state.retired.fold()
        except OSError as exc:  # the record is whole as it was; the next deletion retries
            log.warning("%s: the retired record is not folded: %s", self.directory, exc)
        maybe_compact(state)

    def _unlink_undeleted(self) -> bool:
        """Unlink the files of deleted segments still on disk; returns whether any went."""
        went = False
        for first, files in list(self.undeleted.items()):
            left = []
            for f in files:
                try:
                    os.unlink(f)
                    went = True
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    log.warning("%s: retention cannot delete %s yet: %s", self.directory, f, exc)
                    left.append(f)
            if left:
                self.undeleted[first] = tuple(left)
            else:
                del self.undeleted[first]
        return went


def _rows_of(state: TableState, first: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Robot ids (str, shape (n,)) and seqs (int64, shape (n,)) of rows ``[first, first + n)``,
    from the row index (every sealed row is indexed)."""
    idx = state.index
    lo, hi = max(first, idx.base) - idx.base, min(first + n, idx.end) - idx.base
    names = np.asarray(idx.robots.names, dtype=object)
    codes = idx.cols["robot"][lo:hi]
    robots = names[codes].astype(str) if len(codes) else np.empty(0, dtype=str)
    return robots, idx.cols["seq"][lo:hi].copy()
