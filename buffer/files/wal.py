"""Write-ahead log: checksummed records, group commit, acknowledgement after fdatasync.

A file is a header (marker and first row) and records (magic, length, first row, XXH3-64
checksum seeded with the first row, one Arrow IPC record batch message). A torn or corrupt
tail ends the log (nothing from it on was acknowledged); a complete header of another
version is refused. Appends share one fdatasync per stripe (leader/follower group commit);
after a failed write or fdatasync the log refuses writes until :meth:`WriteAheadLog.reset`.
The layout, the group commit and the failure rules: docs/buffer.md ("The write-ahead log").
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

from buffer.errors import UnsupportedFormatError
from buffer.files.encoding import Piece, pieces_size
from buffer.files.format import SUPPORTED_FORMAT_VERSIONS, WAL_MARKER_PREFIX, wal_marker
from foundation.durable import atomic_write_bytes, fsync_dir

FILE_MAGIC = wal_marker()
# Version 1 WALs have the same record layout; only sealing differs (see buffer.files.format).
_READABLE_MARKERS = {wal_marker(v) for v in SUPPORTED_FORMAT_VERSIONS}
FILE_HEADER = struct.Struct("<8sQ")
REC_HEADER = struct.Struct("<IIQQ")
REC_MAGIC = 0x5246574C  # "RFWL"
FILE_HEADER_BYTES = FILE_HEADER.size
_IOV_MAX = 1024  # Linux's limit on buffers per writev


def wal_name(first_row: int, stripe: int = 0) -> str:
    return f"wal-{first_row:016d}-{stripe:02d}.log"


SPARE_GLOB = "wal-spare-*.log"  # the next generation's files, made ahead (never a record)


def spare_name(generation: int, stripe: int) -> str:
    """A spare's name: unique per preparation, so no two files ever share one."""
    return f"wal-spare-{generation:06d}-{stripe:02d}.log"


@dataclass
class WalRecord:
    first_row: int
    payload: bytes
    end: int = 0  # file offset just past this record


@dataclass
class WalScan:
    """What :func:`scan_wal` found: intact records and where the intact part ends."""

    first_row: int
    records: list[WalRecord]
    good_bytes: int
    file_bytes: int

    @property
    def torn(self) -> bool:
        return self.good_bytes < self.file_bytes


def checksum(first_row: int, payload: bytes | memoryview) -> int:
    return int(xxhash.xxh3_64_intdigest(payload, seed=first_row))


def record_header(first_row: int, payload: bytes | memoryview) -> bytes:
    return REC_HEADER.pack(REC_MAGIC, len(payload), first_row, checksum(first_row, payload))


def pieces_header(first_row: int, pieces: Sequence[Piece]) -> bytes:
    """:func:`record_header` of the concatenation of ``pieces``, without concatenating them
    (xxh3 streamed over the pieces gives the one-shot digest)."""
    h = xxhash.xxh3_64(seed=first_row)
    for p in pieces:
        h.update(p)
    return REC_HEADER.pack(REC_MAGIC, pieces_size(pieces), first_row, h.intdigest())


def check_marker(path: Path, head: bytes) -> bool:
    """True when ``head`` (the file's first bytes, up to 8) is a readable marker; False when
    the header was never fully written (short or zero bytes: a torn file, never acked).

    Raises:
        UnsupportedFormatError: another format version, or a marker that is not ours.
    """
    complete = len(head) == len(FILE_MAGIC)
    if head in _READABLE_MARKERS:
        return True
    if not head.strip(b"\0") or (not complete and FILE_MAGIC.startswith(head.rstrip(b"\0"))):
        return False
    if head.startswith(WAL_MARKER_PREFIX) and complete:
        found = f"version {head[len(WAL_MARKER_PREFIX) :].decode('ascii', 'replace')}"
    else:
        found = f"marker {head!r} (not a robofleet WAL)"
    raise UnsupportedFormatError(path, found, SUPPORTED_FORMAT_VERSIONS)


def scan_wal(path: Path) -> WalScan:
    """Read every intact record of a WAL file, stopping at the first torn or corrupt one.

    Raises:
        UnsupportedFormatError: the file's marker is another format version or not ours.
    """
    data = path.read_bytes()
    if not check_marker(path, data[: len(FILE_MAGIC)]) or len(data) < FILE_HEADER.size:
        return WalScan(-1, [], 0, len(data))
    _magic, first_row = FILE_HEADER.unpack_from(data, 0)
    pos = FILE_HEADER.size
    records = []
    mv = memoryview(data)
    while pos + REC_HEADER.size <= len(data):
        magic_r, length, row, crc = REC_HEADER.unpack_from(data, pos)
        end = pos + REC_HEADER.size + length
        if magic_r != REC_MAGIC or end > len(data):
            break
        payload = mv[pos + REC_HEADER.size : end]
        if checksum(row, payload) != crc:
            break
        records.append(WalRecord(row, bytes(payload), end))
        pos = end
    return WalScan(first_row, records, pos, len(data))


def list_wals(directory: Path) -> Iterator[tuple[int, Path]]:
    for p in sorted(directory.glob("wal-*.log")):
        try:
            yield int(p.stem.split("-")[1]), p
        except (IndexError, ValueError):
            continue


def keep_only(path: Path, recs: list[WalRecord], kept: set[int]) -> None:
    """Make WAL file ``path`` hold exactly its records whose first row is in ``kept``, durably.

    ``recs`` are the file's complete records in file order (:func:`scan_wal`). Appends write
    their records outside the buffer lock, so a file's records need not be in row order: a
    dropped record may sit before a kept one. Then the file is rewritten
    (``foundation.durable.atomic_write_bytes``, which needs the file's size in free space);
    otherwise it is cut after the last kept record (after its header when none is kept:
    needs no space) and fdatasynced.

    Raises:
        OSError: as the OS reports it (the file is then unchanged, or cut and not yet synced).
    """
    keep = [r for r in recs if r.first_row in kept]
    n = len(keep)
    if all(a is b for a, b in zip(recs[:n], keep, strict=True)):  # a prefix of the file
        size = keep[-1].end if keep else FILE_HEADER.size
        fd = os.open(path, os.O_RDWR)
        try:
            if os.fstat(fd).st_size > size:
                os.ftruncate(fd, size)
            os.fdatasync(fd)
        finally:
            os.close(fd)
        return
    parts: list[bytes | memoryview] = [FILE_HEADER.pack(FILE_MAGIC, int(path.stem.split("-")[1]))]
    for r in keep:
        parts += [record_header(r.first_row, r.payload), r.payload]
    atomic_write_bytes(path, b"".join(parts))


class WriteAheadLog:
    """The active WAL file of one buffer directory, with group commit.

    Positions (``lsn``) count bytes over the whole life of this object, across rotations, so
    a position returned by :meth:`write` stays comparable after :meth:`rotate`.
    """

    def __init__(
        self, directory: Path, first_row: int, max_delay_s: float, stripe: int = 0
    ) -> None:
        self.directory = directory
        self.stripe = stripe
        self.max_delay_s = max_delay_s
        self._lock = threading.Lock()  # fd, written
        self._sync_lock = threading.Lock()  # one fdatasync at a time; rotation excludes it
        self._cond = threading.Condition(threading.Lock())
        self._written = 0
        self._synced = 0
        self._syncing = False
        self._inflight = 0
        self._fsyncs = 0
        self._failed: BaseException | None = None  # a failed write or sync, until reset
        self.path, self._fd = self.open_next(first_row)
        self._size = FILE_HEADER.size  # bytes of whole records (and header) in the file

    def open_next(self, first_row: int, *, sync_dir: bool = True) -> tuple[Path, int]:
        """Create (durably) the file of this stripe starting at ``first_row``: ``(path, fd)``.
        ``sync_dir=False``: the caller fsyncs the directory (once for several files) before
        any record goes into the file.

        Raises:
            OSError: e.g. ENOSPC; no file is left behind.
        """
        path = self.directory / wal_name(first_row, self.stripe)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            _write_all(fd, FILE_HEADER.pack(FILE_MAGIC, first_row))
            os.fdatasync(fd)
            if sync_dir:
                fsync_dir(self.directory)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        return path, fd

    @property
    def fsync_count(self) -> int:
        return self._fsyncs

    @property
    def synced(self) -> int:
        """The position every byte below which is on stable storage (never decreases)."""
        return self._synced

    @property
    def syncing(self) -> bool:
        """Whether a :meth:`sync` leader is between taking the lead and publishing what it
        synced. It updates :attr:`synced` and clears this together, before it returns, so a
        caller that reads this as True (after reading :attr:`synced`) can count on that
        leader returning after the read."""
        return self._syncing

    def begin(self) -> None:
        """Announce a record about to be written (a sync leader waits a moment for it)."""
        with self._cond:
            self._inflight += 1

    def end(self) -> None:
        """The announced record is written (or will not be): leaders stop waiting for it."""
        with self._cond:
            self._inflight -= 1
            if self._syncing:
                self._cond.notify_all()

    def write(self, first_row: int, payload: bytes | memoryview | Sequence[Piece]) -> int:
        """Append one record (not yet durable); returns the position :meth:`sync` needs.

        ``payload``: the record's bytes, or pieces to write as their concatenation (the
        zero-copy IPC message of ``buffer.files.encoding.ipc_pieces``).
        """
        return self.write_record(first_row, payload)[0]

    def write_record(
        self, first_row: int, payload: bytes | memoryview | Sequence[Piece]
    ) -> tuple[int, int]:
        """:meth:`write`, also returning where the payload starts in the current file:
        ``(position for sync, file offset of the payload)``."""
        pieces: Sequence[Piece] = [payload] if isinstance(payload, bytes | memoryview) else payload
        header = pieces_header(first_row, pieces)
        iov = [header, *pieces]
        total = len(header) + pieces_size(pieces)
        with self._lock:
            if self._failed is not None:
                raise self._failed_earlier()
            try:
                done = _writev(self._fd, iov)
                if done < total:  # a short write: finish it from where it stopped
                    _write_all(self._fd, b"".join(bytes(p) for p in iov)[done:])
            except OSError as exc:
                self._cut_back(exc)
                raise
            start = self._size + len(header)
            self._size += total
            self._written += total
            return self._written, start

    def _failed_earlier(self) -> OSError:
        """The refusal of a write or sync after a failure (with that failure's errno)."""
        err = OSError(f"write-ahead log failed earlier: {self._failed}")
        err.errno = getattr(self._failed, "errno", None)
        return err

    def _cut_back(self, exc: OSError) -> None:
        """Drop what a failed write left behind the last whole record (locked); when even
        that fails, nothing more is written to this file until :meth:`reset`."""
        try:
            os.ftruncate(self._fd, self._size)
            os.lseek(self._fd, self._size, os.SEEK_SET)
        except OSError:
            with self._cond:
                self._failed = exc

    def sync(self, lsn: int) -> None:
        """Block until everything up to ``lsn`` is on stable storage.

        Raises:
            OSError: fdatasync failed (then every later sync fails too: the log is unusable).
        """
        while True:
            with self._cond:
                while self._synced < lsn and self._syncing:
                    self._cond.wait()
                if self._failed is not None:
                    raise self._failed_earlier()
                if self._synced >= lsn:
                    return
                self._syncing = True
                # Linger only for records announced and not written yet: an append past its
                # write (waiting for its own sync or acknowledgement) adds nothing to share.
                if self.max_delay_s > 0 and self._inflight > 0:
                    deadline = time.monotonic() + self.max_delay_s
                    while self._inflight > 0:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        self._cond.wait(left)
            try:
                with self._sync_lock:
                    with self._lock:
                        fd, target = self._fd, self._written
                    if target > self._synced:
                        os.fdatasync(fd)
                        self._fsyncs += 1
            except BaseException as exc:
                with self._cond:
                    self._failed = exc
                    self._syncing = False
                    self._cond.notify_all()
                raise
            with self._cond:
                self._synced = max(self._synced, target)
                self._syncing = False
                self._cond.notify_all()

    def sync_all(self) -> int:
        """fdatasync the current file (a rotation, no write in flight); returns the position
        it covers.

        Raises:
            OSError: fdatasync failed, now (the log then refuses writes and syncs until
                reset) or earlier (a later fdatasync may succeed without the lost pages).
        """
        with self._sync_lock, self._lock:
            if self._failed is not None:
                raise self._failed_earlier()
            if self._synced >= self._written:
                return self._written  # every record is durable already (group commit)
            try:
                os.fdatasync(self._fd)
            except OSError as exc:
                with self._cond:
                    self._failed = exc
                    self._cond.notify_all()
                raise
            self._fsyncs += 1
            return self._written

    def switch_to(self, path: Path, fd: int, synced: int) -> Path:
        """Close the current file (made durable up to ``synced`` by :meth:`sync_all`) and
        write ``path`` / ``fd`` (from :meth:`open_next`) from now on; returns the old path."""
        with self._sync_lock, self._lock:
            os.close(self._fd)
            old, self.path, self._fd, self._size = self.path, path, fd, FILE_HEADER.size
        with self._cond:
            self._synced = max(self._synced, synced)
            self._cond.notify_all()
        return old

    def reset(self, end: int) -> None:
        """After a failed write or fdatasync: keep exactly the file's records of rows below
        ``end`` (the buffer's durable watermark: each of them is durable), durably, and take
        writes again on a fresh descriptor. Call with no write or sync in flight.

        Raises:
            OSError: the file could not be cut or rewritten (it then stays failed).
        """
        with self._sync_lock, self._lock:
            recs = scan_wal(self.path).records
            keep_only(self.path, recs, {r.first_row for r in recs if r.first_row < end})
            fd = os.open(self.path, os.O_WRONLY)
            os.close(self._fd)
            self._fd = fd
            self._size = os.lseek(fd, 0, os.SEEK_END)
        with self._cond:
            self._failed = None
            self._synced = self._written  # what was written is durable now or cut away
            self._cond.notify_all()

    def close(self) -> None:
        """fdatasync and close the file. After a failed write or fdatasync nothing more
        counts as synced: a later fdatasync that succeeds does not prove the pages the failed
        one lost reached the disk (they may have been dropped), so recovery decides."""
        with self._sync_lock, self._lock:
            if self._fd >= 0:
                if self._failed is None:
                    os.fdatasync(self._fd)
                os.close(self._fd)
                self._fd = -1
        with self._cond:
            if self._failed is None:
                self._synced = self._written
            self._cond.notify_all()


class StripedWal:
    """Several WAL files written in parallel, so concurrent appends share the disk's
    ability to run several fdatasyncs at once (one file allows only one at a time).

    Rows get global ids under the buffer's lock and every record carries its first row, so
    recovery merges the stripes by row id and keeps the contiguous prefix. The buffer
    acknowledges an append only when every row before it is durable too (a watermark), so a
    gap at recovery only ever drops rows that were never acknowledged.

    The next generation's files are made ahead by a background thread (``wal-spare-*.log``:
    the marker and a placeholder first row, fdatasynced, one directory fsync), so a rotation,
    which every append waits for, only writes each file's first row into its header and
    renames it (one directory fsync) instead of creating and syncing every file (an
    fdatasync and a directory fsync per stripe). The header's first row is
    made durable by the fdatasync of the file's first record (recovery reads the first row
    from the file name, never the header); a spare left by a crash holds no record and is
    deleted when the directory is opened.
    """

    def __init__(self, directory: Path, first_row: int, max_delay_s: float, stripes: int) -> None:
        self.directory = directory
        self.logs = [WriteAheadLog(directory, first_row, max_delay_s, i) for i in range(stripes)]
        self._spare_lock = threading.Lock()
        self._spares: list[tuple[Path, int]] | None = None
        self._closed = False
        self._generation = 0
        self._preparing: threading.Thread | None = None
        self._prepare_in_background()

    @property
    def fsync_count(self) -> int:
        return sum(w.fsync_count for w in self.logs)

    @property
    def paths(self) -> list[Path]:
        return [w.path for w in self.logs]

    def rotate(self, first_row: int) -> list[Path]:
        """Make every stripe durable and continue in new files from ``first_row``; returns
        the old paths. The new files all exist before an old one is closed, so a failure
        (a full disk) leaves every stripe as it was.

        Raises:
            OSError: creating a file or an fdatasync failed.
        """
        fresh = self._take_spares(first_row) or self._create(first_row)
        try:
            synced = [w.sync_all() for w in self.logs]
        except BaseException:
            _discard(fresh)
            raise
        old = [
            w.switch_to(path, fd, n)
            for w, (path, fd), n in zip(self.logs, fresh, synced, strict=True)
        ]
        self._prepare_in_background()
        return old

    def _create(self, first_row: int) -> list[tuple[Path, int]]:
        """Every stripe's file from ``first_row``, made here (no spares ready)."""
        fresh: list[tuple[Path, int]] = []
        try:
            for w in self.logs:
                fresh.append(w.open_next(first_row, sync_dir=False))
            fsync_dir(self.directory)  # one directory fsync for all the new files
        except BaseException:
            _discard(fresh)
            raise
        return fresh

    def _prepare_in_background(self) -> None:
        """Start making spares, unless that is under way already (one at a time)."""
        with self._spare_lock:
            if self._closed or (self._preparing is not None and self._preparing.is_alive()):
                return
            self._generation += 1
            t = threading.Thread(
                target=self._prepare, args=(self._generation,), name="wal-spares", daemon=True
            )
            self._preparing = t
        t.start()

    def _prepare(self, generation: int) -> None:
        """Make the spares (see the class docstring); none are kept when one fails (a full
        disk: the rotation then creates its files itself and reports the error)."""
        made: list[tuple[Path, int]] = []
        try:
            for w in self.logs:
                path = self.directory / spare_name(generation, w.stripe)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                made.append((path, fd))
                _write_all(fd, FILE_HEADER.pack(FILE_MAGIC, 0))
                os.fdatasync(fd)
            fsync_dir(self.directory)
        except OSError:
            _discard(made)
            return
        with self._spare_lock:
            if self._closed:
                _discard(made)
                return
            self._spares = made

    def _take_spares(self, first_row: int) -> list[tuple[Path, int]] | None:
        """The spares as the files of ``first_row`` (header's first row written, renamed,
        one directory fsync), or None when none are ready."""
        with self._spare_lock:
            spares, self._spares = self._spares, None
        if spares is None:
            return None
        out: list[tuple[Path, int]] = []
        try:
            for w, (path, fd) in zip(self.logs, spares, strict=True):
                os.pwrite(fd, struct.pack("<Q", first_row), 8)  # FILE_HEADER's first row
                final = self.directory / wal_name(first_row, w.stripe)
                os.replace(path, final)
                out.append((final, fd))
            fsync_dir(self.directory)
        except BaseException:
            _discard(out + spares[len(out) :])
            raise
        return out

    def reset(self, end: int) -> None:
        """:meth:`WriteAheadLog.reset` of every stripe."""
        for w in self.logs:
            w.reset(end)

    def close(self) -> None:
        with self._spare_lock:
            self._closed = True
            spares, self._spares = self._spares, None
            preparing = self._preparing
        if preparing is not None:
            preparing.join()  # it sees _closed and discards what it made
        _discard(spares or [])
        for w in self.logs:
            w.close()


def _discard(files: list[tuple[Path, int]]) -> None:
    """Close and delete files made for a generation that will not be used."""
    for path, fd in files:
        os.close(fd)
        path.unlink(missing_ok=True)


def _writev(fd: int, iov: list[Any]) -> int:
    """``os.writev`` in batches of at most IOV_MAX buffers; bytes written (short on a
    partial write)."""
    if len(iov) <= _IOV_MAX:
        return os.writev(fd, iov)
    done = 0
    for i in range(0, len(iov), _IOV_MAX):
        part = iov[i : i + _IOV_MAX]
        n = os.writev(fd, part)
        done += n
        if n < pieces_size(part):
            break
    return done


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
