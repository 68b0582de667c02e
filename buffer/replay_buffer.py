"""The replay buffer: durable appends, recovery, windows, sampling, offline mounts.

Directory layout::

    schema.json                      the StepSchema (so a directory reopens without one)
    LOCK                             flock held by the one writer process
    wal-<first_row>-<stripe>.log     the open write-ahead log stripes (see buffer.wal)
    seg-<first>-<rows>-<stripe>.wal  sealed segments: WAL files renamed (see buffer.sealed)
    seg-<first_row>-<rows>.arrow     version-1 sealed segments (read, no longer written)

Open = remove ``*.tmp``; finish an interrupted seal (stripes still under their WAL name);
map every segment and rebuild the row index from them; delete WAL files already covered by
a segment; replay the rest (merge stripes by row, keep the contiguous prefix, drop torn
tails) and seal what they hold in place (truncate or rewrite, fdatasync, rename); start a
fresh WAL. ``close`` seals the open tail, so a clean close leaves nothing to replay.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
from numpy.typing import ArrayLike, NDArray

from buffer.config import BufferSettings
from buffer.errors import (
    BackpressureError,
    BufferClosedError,
    RateLimiterTimeout,
    StepValidationError,
)
from buffer.index import RowIndex
from buffer.rate_limiter import RateLimiter
from buffer.samplers import Sampler, SamplingView, Source, UniformSampler
from buffer.schema import FINAL_PREFIX, StepSchema
from buffer.sealed import WalSegment, list_sealed, seal_files
from buffer.segments import MappedSegment, list_segments
from buffer.storage import Chunk, Segment, TieredStorage, out_arrays
from buffer.wal import (
    FILE_HEADER,
    FILE_MAGIC,
    StripedWal,
    WalRecord,
    list_wals,
    record_header,
    scan_wal,
)
from robofleet.durable import atomic_write_text, fsync_dir, replace_durably

SCHEMA_FILE = "schema.json"


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


@dataclass
class OfflineView:
    """Rows of another (or the same) buffer directory mounted as offline data, not copied.

    Attributes:
        buffer: the mounted buffer (read-only when it is another directory).
        rows: eligible global row ids of ``buffer`` that passed the filters, ascending.
        filters: the filters used, for display.
    """

    name: str
    buffer: ReplayBuffer
    rows: np.ndarray
    filters: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.rows)


class ReplayBuffer:
    """A persistent, cache-aware replay buffer. Use :meth:`open`; see ``buffer/__init__``."""

    def __init__(
        self,
        directory: Path,
        schema: StepSchema,
        settings: BufferSettings,
        read_only: bool,
        rate_limiter: RateLimiter | None,
    ) -> None:
        self.directory = directory
        self.schema = schema
        self.settings = settings
        self.read_only = read_only
        self.rate_limiter = rate_limiter
        self._lock = threading.RLock()
        self._closed = False
        self.storage = TieredStorage(
            schema, settings.memory_budget_bytes, settings.hot_fraction, self._lock
        )
        self.index = RowIndex()
        self.visible = 0
        self.transitions_inserted = 0
        self.offline: list[OfflineView] = []
        self._lock_fd = -1
        self._wal: StripedWal | None = None
        self._watermark = 0  # every row below it is durable
        self._durable: dict[int, int] = {}  # synced appends above the watermark: first -> end
        self._unwritten = 0  # appends given rows whose WAL record is not written yet
        self._failed: BaseException | None = None
        self._tail: Chunk | None = None
        self._seal_queue: list[tuple[Chunk, list[Path]]] = []
        self._spare: dict[str, np.ndarray] | None = None
        self._seal_cond = threading.Condition(self._lock)
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self.sealed_segments: list[tuple[int, int, Path]] = []
        self._segment_files: dict[int, list[Path]] = {}  # first row -> every file of it
        self.recovery_seconds = 0.0
        self.recovered_rows = 0
        self.torn_bytes_dropped = 0
        self._ack_latencies: list[float] = []
        hot_rows = max(1, int(self.storage.hot_limit // 4 // max(self.storage.row_bytes, 1)))
        target_rows = max(1, settings.segment_target_bytes // max(self.storage.row_bytes, 1))
        self.rows_per_segment = max(1, min(hot_rows, target_rows))

    # ------------------------------------------------------------------ opening ------
    @classmethod
    def open(
        cls,
        directory: str | Path,
        schema: StepSchema | None = None,
        settings: BufferSettings | None = None,
        *,
        read_only: bool = False,
        rate_limiter: RateLimiter | None = None,
    ) -> ReplayBuffer:
        """Open (creating or recovering) the buffer in ``directory``.

        Args:
            directory: the buffer directory; created when missing (unless ``read_only``).
            schema: required for a new directory; for an existing one it must have the same
                columns, or may be None to use the stored one.
            settings: budgets, segment size, group commit delay (default ``BufferSettings()``).
            read_only: open without writing or locking (for mounting another run's data);
                a torn WAL tail is skipped, not truncated.
            rate_limiter: when given, appends and samples go through it.

        Raises:
            ValueError: no schema for a new directory, or a schema that differs from the
                stored one.
            BlockingIOError: another process holds the directory open for writing.
            CorruptDataError: a sealed segment is unreadable.
            UnsupportedFormatError: a WAL or segment file has another format version (or a
                marker that is not ours); nothing was changed (see ``buffer.format``).
        """
        directory = Path(directory)
        settings = settings or BufferSettings()
        stored = directory / SCHEMA_FILE
        if stored.exists():
            on_disk = StepSchema.from_json(stored.read_text())
            if schema is not None and not schema.same_columns(on_disk):
                raise ValueError(
                    f"{directory}: the given schema differs from the stored one "
                    f"({on_disk.arrow_schema.names})"
                )
            schema = schema or on_disk
        elif schema is None:
            raise ValueError(f"{directory}: no stored schema; pass schema= to create a buffer")
        elif read_only:
            raise FileNotFoundError(f"{directory}: not a buffer directory")
        if not read_only:
            directory.mkdir(parents=True, exist_ok=True)
        buf = cls(directory, schema, settings, read_only, rate_limiter)
        if not read_only:
            buf._lock_directory()
            if not stored.exists():
                atomic_write_text(stored, schema.to_json())
        try:
            buf._recover()
        except BaseException:
            if buf._lock_fd >= 0:  # a refused open must not keep the directory locked
                os.close(buf._lock_fd)
                buf._lock_fd = -1
            raise
        buf._start_threads()
        return buf

    def _lock_directory(self) -> None:
        fd = os.open(self.directory / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise BlockingIOError(
                f"{self.directory}: another process has this buffer open for writing"
            ) from None
        self._lock_fd = fd

    def _recover(self) -> None:
        t0 = time.monotonic()
        d = self.directory
        if not self.read_only:
            for tmp in d.glob("*.tmp"):
                tmp.unlink()
        live: dict[int, list[Path]] = {}
        for first, path in list_wals(d):
            live.setdefault(first, []).append(path)
        # Segments: version-1 Arrow files and version-2 sealed WAL files. A crash in the
        # middle of a seal's renames leaves some of its stripes under their WAL name: they
        # are complete (fdatasynced before the first rename), so the seal is finished here.
        found: list[tuple[int, int, list[Path], bool]] = [
            (first, rows, [path], False) for first, rows, path in list_segments(d)
        ]
        for (first, rows), paths in list_sealed(d).items():
            sealed_stripes = {_stripe_of(p) for p in paths}
            # A stripe listed under both names was renamed meanwhile (a live writer while
            # this is a read-only mount): the sealed name wins.
            rest = []
            for p in live.pop(first, []):
                if _stripe_of(p) not in sealed_stripes:
                    rest.append(p)
                elif not self.read_only:
                    p.unlink()  # a stale copy of a stripe that is sealed already
            if rest and not self.read_only:
                paths = sorted(set(paths) | set(seal_files(d, first, rows, rest)))
            elif rest:
                paths = paths + rest
            found.append((first, rows, paths, True))
        found.sort(key=lambda f: f[0])
        if found:
            self.index = RowIndex(base=found[0][0])
        expected = found[0][0] if found else None
        for first, rows, paths, is_wal in found:
            if expected is not None and first < expected:
                continue  # overlap: only an interrupted version-1 seal of recovered rows
            seg = self._open_segment(paths, first, rows, is_wal)
            self._index_batch(seg.scalar_batch(_INDEX_COLUMNS))
            self.storage.add_cold(seg, first)
            self.sealed_segments.append((first, rows, seg.path))
            self._segment_files[first] = list(seg.paths)
            expected = first + rows
        self._replay_wals(live, bool(found))
        if self.index.end == self.index.base and not found:
            self.index = RowIndex(base=0)
        self.visible = self.index.end
        self.transitions_inserted = int(self.index.publish(self.index.base, self.index.end))
        if not self.read_only:
            self._wal = StripedWal(
                d, self.visible, self.settings.group_commit_max_delay_s, self.settings.wal_stripes
            )
            self._watermark = self.visible
            self._tail = self.storage.new_tail(self.visible, self.rows_per_segment)
        with self._lock:
            self._apply_retention()
        self.recovery_seconds = time.monotonic() - t0

    def _open_segment(self, paths: list[Path], first: int, rows: int, is_wal: bool) -> Segment:
        if is_wal:
            return WalSegment(paths, first, rows, self.schema.arrow_schema)
        return MappedSegment(paths[0], rows)

    def _replay_wals(self, live: dict[int, list[Path]], have_segments: bool) -> None:
        """Replay unsealed WAL files: keep the contiguous prefix of their records after the
        sealed rows, drop the rest (torn tails, records after a gap: never acknowledged), and
        seal what is kept in place (truncate, fdatasync, rename: nothing is rewritten)."""
        d = self.directory
        end = self.index.end
        records: dict[int, tuple[bytes, Path, int]] = {}
        files: list[tuple[int, Path]] = []
        in_file: dict[Path, list[WalRecord]] = {}  # complete records, in file order
        for first, paths in sorted(live.items()):
            for path in paths:
                try:
                    scan = scan_wal(path)
                except FileNotFoundError:  # read-only mount of a live directory: just sealed
                    continue
                self.torn_bytes_dropped += scan.file_bytes - scan.good_bytes
                in_file[path] = scan.records
                for rec in scan.records:
                    if rec.first_row >= end:  # rows below ``end`` are sealed already
                        records[rec.first_row] = (rec.payload, path, rec.end)
                files.append((first, path))
        if records and not have_segments:
            self.index = RowIndex(base=min(records))
            end = self.index.base
        # Merge the stripes by row id and keep the contiguous prefix. A gap means a record
        # that never became durable; nothing after it was acknowledged (watermark rule).
        pending: list[tuple[int, pa.RecordBatch]] = []
        kept: set[int] = set()
        while end in records:
            payload, _path, _ = records.pop(end)
            batch = _decode_ipc(payload, self.schema.arrow_schema)
            pending.append((end, batch))
            kept.add(end)
            self._index_batch(batch)
            end += batch.num_rows
        if not pending:
            if not self.read_only:
                for _, p in files:
                    p.unlink()
                if files:
                    fsync_dir(d)
            return
        if self.read_only:
            # Serve WAL rows from RAM without writing anything.
            batch = pa.Table.from_batches([b for _, b in pending]).combine_chunks().to_batches()[0]
            first = end - batch.num_rows
            tail = self.storage.new_tail(first, batch.num_rows)
            self.storage.write_rows(tail, batch, 0)
            tail.n = batch.num_rows
            tail.sealed = True
            return
        # Each WAL generation (files sharing a first row) becomes one segment of the rows
        # kept from it; files with nothing kept are deleted.
        gens = sorted({first for first, _ in files})
        for i, first in enumerate(gens):
            stop = gens[i + 1] if i + 1 < len(gens) else end
            rows = [r for r, b in pending if first <= r < stop]
            paths = [p for f, p in files if f == first]
            if not rows:
                for p in paths:
                    p.unlink()
                continue
            n = sum(b.num_rows for r, b in pending if first <= r < stop)
            seg_first = rows[0]
            for p in paths:
                _keep_only(p, in_file.get(p, []), kept)
            sealed = seal_files(d, seg_first, n, paths)
            seg = WalSegment(sealed, seg_first, n, self.schema.arrow_schema)
            self.storage.add_cold(seg, seg_first)
            self.sealed_segments.append((seg_first, n, seg.path))
            self._segment_files[seg_first] = list(seg.paths)
            self.recovered_rows += n
        fsync_dir(d)

    def _index_batch(self, batch: pa.RecordBatch) -> None:
        self.index.add(batch, self._row_bytes(batch))

    def _row_bytes(self, batch: pa.RecordBatch) -> np.ndarray:
        n = batch.num_rows
        out = np.full(n, self.storage.row_bytes, dtype=np.int64)
        return out

    def _start_threads(self) -> None:
        if not self.read_only:
            t = threading.Thread(target=self._sealer, name="buffer-sealer", daemon=True)
            t.start()
            self._threads.append(t)
        if self.settings.prefetch:
            t = threading.Thread(target=self._prefetcher, name="buffer-prefetch", daemon=True)
            t.start()
            self._threads.append(t)

    # ------------------------------------------------------------------ writing ------
    def can_accept(self, n: int = 1) -> bool:
        """Whether an append of ``n`` records would proceed now (for uplink backpressure)."""
        if self._closed or self.read_only:
            return False
        return self.rate_limiter is None or self.rate_limiter.can_insert(n)

    def append(
        self,
        records: pa.RecordBatch | pa.Table | Sequence[Mapping[str, Any]],
        *,
        timeout: float | None = None,
    ) -> AppendResult:
        """Validate, log durably, and store a batch of steps.

        All-or-nothing: the whole batch is validated before anything is written; one bad
        record rejects the batch and nothing of it is stored or acknowledged. Records whose
        ``(robot_id, seq)`` is already stored are duplicates: they are acknowledged and not
        stored again (the rest of the batch is stored). The call returns only after the
        fdatasync covering the new records (group commit shares one fdatasync among
        concurrent appends).

        Args:
            records: an Arrow record batch/table with the schema's columns (the wire format),
                or a list of step dicts (see :meth:`StepSchema.batch_from_records`).
            timeout: with a rate limiter, how long to wait for room; ``0`` fails at once.

        Raises:
            StepValidationError: a record is invalid (names record and field), or its seq is
                out of order (at or below its robot's highest stored seq but not stored).
            BackpressureError: the rate limiter did not admit the insert within ``timeout``
                (carries ``retry_after_s``).
            BufferClosedError: the buffer is closed or read-only.
            OSError: the disk failed; nothing of this batch was acknowledged.
        """
        t0 = time.perf_counter()
        if self._closed or self.read_only or self._wal is None:
            raise BufferClosedError(f"{self.directory}: buffer is closed or read-only")
        if isinstance(records, pa.RecordBatch | pa.Table):
            batch = self.schema.validate(records)
        else:
            batch = self.schema.validate(self.schema.batch_from_records(list(records)))
        if batch.num_rows == 0:
            return AppendResult({}, 0, 0, (self.visible, self.visible))
        robots = np.asarray(batch.column("robot_id").to_numpy(zero_copy_only=False), dtype=object)
        seqs = batch.column("seq").to_numpy()
        limited = 0
        wal = self._wal.logs[zlib.crc32(str(robots[0]).encode()) % len(self._wal.logs)]
        wal.begin()
        try:
            with self._lock:
                dup, bad = self.index.classify_seqs(robots, seqs)
                if bad >= 0:
                    last = self.index.last_seq(str(robots[bad]))
                    raise StepValidationError(
                        f"record {bad} (robot_id={robots[bad]!r}, seq={int(seqs[bad])}): field "
                        f"'seq' is out of order (robot's highest stored seq is {last}, and this "
                        "seq was never stored)",
                        record=bad,
                        field="seq",
                        robot_id=str(robots[bad]),
                        seq=int(seqs[bad]),
                    )
            new = batch if not dup.any() else batch.filter(pa.array(~dup))
            n_new = new.num_rows
            if n_new and self.rate_limiter is not None:
                try:
                    self.rate_limiter.await_insert(n_new, timeout)
                    limited = n_new
                except RateLimiterTimeout:
                    raise BackpressureError(
                        f"buffer is ahead of sampling; {n_new} records not accepted",
                        self.rate_limiter.retry_after_s(),
                    ) from None
            payload: bytes | memoryview = _encode_ipc(new) if n_new else b""
            with self._lock:
                if self._closed:
                    raise BufferClosedError(f"{self.directory}: buffer closed")
                if n_new:
                    # Re-check under the lock: a concurrent append may have stored some rows.
                    dup2, bad = self.index.classify_seqs(
                        np.asarray(new.column("robot_id").to_numpy(zero_copy_only=False)),
                        new.column("seq").to_numpy(),
                    )
                    if dup2.any() or bad >= 0:
                        new = new.filter(pa.array(~dup2)) if bad < 0 else new.slice(0, 0)
                        payload = _encode_ipc(new) if new.num_rows else b""
                        if self.rate_limiter is not None and limited > new.num_rows:
                            self.rate_limiter.undo_insert(limited - new.num_rows)
                            limited = new.num_rows
                        n_new = new.num_rows
                lsn = 0
                first = end = self.index.end
                if n_new:
                    tail = self._tail_for(n_new)
                    first, end = self.index.add(new, self._row_bytes(new))
                    self._unwritten += 1
            limited = 0
            if n_new:
                # The rows are ours now; copy them into the WAL and the tail WITHOUT the
                # buffer lock (other appends proceed). Nothing reads them before they are
                # published, which needs their fdatasync; a rotation waits for these writes.
                try:
                    try:
                        lsn = wal.write(first, payload)
                        self.storage.write_rows(tail, new, first - tail.first_row)
                    finally:
                        with self._lock:
                            self._unwritten -= 1
                            self._seal_cond.notify_all()
                    wal.sync(lsn)
                except BaseException as exc:
                    with self._lock:
                        if self._failed is None:  # rows given out can no longer be durable
                            self._failed = exc
                        self._seal_cond.notify_all()
                    raise
            with self._lock:
                if n_new:
                    self._durable[first] = end
                    self._advance_watermark()
                # Acknowledge only when every row before ours is durable too, so recovery
                # (which keeps the contiguous prefix of the WAL stripes) has all of them.
                # A pure retry waits for the rows it duplicates (all below ``end``).
                while self.visible < end:
                    if self._failed is not None:
                        raise OSError(f"write-ahead log failed: {self._failed}")
                    self._seal_cond.wait(0.5)
                acked = self._acked(robots, seqs)
            self._ack_latencies.append(time.perf_counter() - t0)
            if len(self._ack_latencies) > 100_000:
                del self._ack_latencies[:50_000]
            return AppendResult(acked, n_new, int(batch.num_rows - n_new), (first, end))
        finally:
            wal.end()
            if limited and self.rate_limiter is not None:
                self.rate_limiter.undo_insert(limited)

    def _advance_watermark(self) -> None:
        """Move the durable watermark over contiguous synced appends and publish (locked)."""
        start = self._watermark
        while self._watermark in self._durable:
            self._watermark = self._durable.pop(self._watermark)
        if self._watermark > start:
            self._publish(start, self._watermark)
            self._seal_cond.notify_all()

    def _acked(self, robots: np.ndarray, seqs: np.ndarray) -> dict[str, int]:
        """Per robot of this call: its highest seq among durable (visible) rows."""
        out = {}
        for rid in np.unique(robots):
            code = self.index.robots.codes.get(str(rid))
            last_row = self.index.robot_last_row.get(code) if code is not None else None
            if last_row is not None and last_row < self.visible:
                out[str(rid)] = int(self.index.cols["seq"][last_row - self.index.base])
            else:  # a newer row of this robot is still in flight: ours are durable
                out[str(rid)] = int(seqs[robots == rid].max())
        return out

    # ------------------------------------------------------------------ lookups ------
    def _durable_seqs_locked(self, robot_id: str | int) -> np.ndarray:
        """View of the robot's durable seqs, ascending (call with the lock held).

        A robot's seqs enter the index in row order, and only rows ``>= visible`` are still
        waiting for their fdatasync, so the durable ones are a prefix of its seq list.
        """
        code = self.index.robots.codes.get(str(robot_id))
        if code is None:
            return np.empty(0, dtype=np.int64)
        rs = self.index.robot_seqs.get(code)
        if rs is None or rs.n == 0:
            return np.empty(0, dtype=np.int64)
        n = rs.n
        if self.index.robot_last_row.get(code, -1) >= self.visible:
            b = self.index.base
            n -= int(
                np.count_nonzero(
                    self.index.cols["robot"][self.visible - b : self.index.end - b] == code
                )
            )
        return rs.seqs[:n]

    def durable_seq(self, robot_id: str | int) -> int | None:
        """Highest ``seq`` of ``robot_id`` stored durably (fdatasync'ed, so acknowledged), or
        None when this buffer holds none of its steps. ``robot_id`` is compared as a string
        (the ``robot_id`` column). Thread-safe; O(1) unless an append of this robot is in
        flight. Rows that retention later deleted still count until the buffer is reopened.
        """
        with self._lock:
            seqs = self._durable_seqs_locked(robot_id)
            return int(seqs[-1]) if len(seqs) else None

    def stored_seqs(self, robot_id: str | int) -> NDArray[np.int64]:
        """Every durable ``seq`` of ``robot_id``, ascending, as a new int64 array of shape
        (n,) (empty when none). Same scope as :meth:`durable_seq`."""
        with self._lock:
            return self._durable_seqs_locked(robot_id).copy()

    def contains(self, robot_id: str | int, seqs: ArrayLike) -> NDArray[np.bool_]:
        """Which of ``seqs`` (int array-like, shape (n,)) of ``robot_id`` are stored durably:
        a bool array of shape (n,). Binary search, O(n log stored); same scope as
        :meth:`durable_seq`.

        Raises:
            ValueError: ``seqs`` is not one-dimensional or not integral.
        """
        q = np.asarray(seqs)
        if q.ndim != 1 or (q.size and not np.issubdtype(q.dtype, np.integer)):
            raise ValueError(f"seqs must be a 1-D integer array, got {q.dtype} shape {q.shape}")
        q = q.astype(np.int64, copy=False)
        with self._lock:
            have = self._durable_seqs_locked(robot_id)
            if not len(have):
                return np.zeros(len(q), dtype=bool)
            pos = np.minimum(np.searchsorted(have, q), len(have) - 1)
            return np.asarray(have[pos] == q, dtype=bool)

    def _tail_for(self, n: int) -> Chunk:
        """The open tail with room for ``n`` rows, sealing the current one when full."""
        assert self._tail is not None and self._wal is not None
        while True:
            tail = self._tail
            used = self.index.end - tail.first_row
            if used + n <= tail.capacity:
                return tail
            if self._unwritten and not self._failed:
                # Rows already given out must be in the old WAL files before they close.
                self._seal_cond.wait(0.05)
                continue
            if not (used and self._seal_queue) or self._failed or self._stop.is_set():
                break
            # An unsealed tail cannot be evicted: with one still queued, wait for its seal
            # (a rename, milliseconds) rather than let the hot tier overshoot the budget.
            self._seal_cond.wait(0.05)
        if used > 0:
            tail.n = used
            old = self._wal.rotate(self.index.end)
            tail.sealed = False
            self._seal_queue.append((tail, old))
            self._seal_cond.notify_all()
        else:
            self.storage.remove_chunks([tail])
        cap = max(self.rows_per_segment, n)
        spare, self._spare = self._spare, None
        if spare is not None:  # it becomes the tail: counted as such from now on
            self.storage.spare_bytes -= len(spare["action"]) * self.storage.row_bytes
            if len(spare["action"]) < cap:
                spare = None
        if spare is None:
            # No pre-faulted spare (the sealer may be allocating one; that stays counted):
            # make room for a fresh tail first, so the peak stays inside the budget.
            extra = cap * self.storage.row_bytes
            self.storage.spare_bytes += extra
            self.storage.enforce_budget()
            self.storage.spare_bytes -= extra
        self._tail = self.storage.new_tail(self.index.end, cap, spare)
        self._seal_cond.notify_all()
        return self._tail

    def _publish(self, first: int, end: int) -> None:
        # Called with the durable watermark only: every row below ``end`` is on disk.
        if end <= self.visible:
            return
        start = min(first, self.visible)
        tail = self._tail
        if tail is not None and tail.first_row <= end <= tail.first_row + tail.capacity:
            tail.n = max(tail.n, end - tail.first_row)
        self.transitions_inserted += self.index.publish(start, end)
        self.visible = end

    # ------------------------------------------------------------------ sealing ------
    def _sealer(self) -> None:
        while True:
            if self._spare is None and not self._stop.is_set():
                # Pre-fault the next tail here, so appends never pay its page faults. Make
                # room for it in the budget first, so the peak stays inside the budget.
                # spare_bytes counts it from now until an append takes it as its tail.
                with self._lock:
                    self.storage.spare_bytes += self.rows_per_segment * self.storage.row_bytes
                    self.storage.enforce_budget()
                spare = self.storage.allocate(self.rows_per_segment)
                with self._lock:
                    self._spare = spare
            with self._lock:
                while not self._seal_queue and not self._stop.is_set() and self._spare is not None:
                    self._seal_cond.wait(0.5)
                if not self._seal_queue:
                    if self._stop.is_set():
                        return
                    continue
                chunk, wal_paths = self._seal_queue[0]
                # Rows of this chunk are durable in the WAL; wait until they are visible.
                while self.visible < chunk.end and not self._stop.is_set():
                    self._seal_cond.wait(0.01)
            self._seal_one(chunk, wal_paths)

    def _seal_one(self, chunk: Chunk, wal_paths: list[Path]) -> None:
        """Seal a full tail: its WAL files (closed and fdatasynced by the rotation) are
        renamed into a segment; nothing is copied (see ``buffer.sealed``)."""
        paths = seal_files(self.directory, chunk.first_row, chunk.n, wal_paths)
        seg = WalSegment(paths, chunk.first_row, chunk.n, self.schema.arrow_schema)
        seg.release_pages()
        with self._lock:
            chunk.sealed = True
            chunk.path = seg.path
            chunk.mapped = seg
            self.sealed_segments.append((chunk.first_row, chunk.n, seg.path))
            self._segment_files[chunk.first_row] = list(seg.paths)
            self._seal_queue.pop(0)
            chunk.heat = max([c.heat for c in self.storage.chunks] + [1.0])
            self.storage.enforce_budget()
            self._apply_retention()
            self._seal_cond.notify_all()

    def flush(self) -> None:
        """Wait until every queued seal is written and the spare tail is ready (quiescent)."""
        with self._lock:
            while self._seal_queue or (self._spare is None and not self._stop.is_set()):
                self._seal_cond.wait(0.05)

    def _apply_retention(self) -> None:
        limit = self.settings.retention_max_bytes
        if not limit or self.read_only:
            return
        sizes = [
            sum(f.stat().st_size for f in self._segment_files.get(first, [p]) if f.exists())
            for first, _, p in self.sealed_segments
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
        gone = self.sealed_segments[:drop]
        self.sealed_segments = self.sealed_segments[drop:]
        paths = {p for _, _, p in gone}
        self.storage.remove_chunks([c for c in self.storage.chunks if c.path in paths])
        for first, _, p in gone:
            for f in self._segment_files.pop(first, [p]):
                f.unlink()
        fsync_dir(self.directory)

    # ------------------------------------------------------------------ prefetch -----
    def _prefetcher(self) -> None:
        while not self._stop.wait(self.settings.prefetch_interval_s):
            try:
                for _ in range(4):
                    c = self.storage.prefetch_candidate()
                    if c is None or not self.storage.promote(c):
                        break
            except Exception:  # noqa: BLE001 - a prefetch failure must not kill serving
                time.sleep(0.5)

    # ------------------------------------------------------------------ reading ------
    @property
    def first_row(self) -> int:
        """First global row still stored (after retention)."""
        with self._lock:
            return self.storage.chunks[0].first_row if self.storage.chunks else self.visible

    def window(self) -> tuple[int, int]:
        """The online sampling window ``[lo, hi)`` of global rows (capacity, FIFO)."""
        with self._lock:
            hi = self.visible
            lo = self.first_row
            cap = self.settings.capacity_transitions
            if cap:
                lo = max(lo, hi - cap)
            cap_b = self.settings.capacity_bytes
            if cap_b:
                rb = self.index.cols["row_bytes"][lo - self.index.base : hi - self.index.base]
                csum = np.cumsum(rb[::-1])
                keep = int(np.searchsorted(csum, cap_b, side="right"))
                lo = max(lo, hi - keep)
            return lo, hi

    def __len__(self) -> int:
        """Transitions (steps with a known successor, or done) in the online window."""
        lo, hi = self.window()
        b = self.index.base
        return int(np.count_nonzero(self.index.cols["eligible"][lo - b : hi - b]))

    @property
    def num_steps(self) -> int:
        """Steps stored and visible (including ones still waiting for their successor)."""
        return self.visible - self.first_row

    def view(self) -> SamplingView:
        lo, hi = self.window()
        return SamplingView(self, lo, hi, [Source(v.buffer, v.rows, v.name) for v in self.offline])

    def sample(
        self,
        batch_size: int,
        sampler: Sampler | None = None,
        *,
        rng: np.random.Generator | None = None,
        timeout: float | None = None,
    ) -> dict[str, np.ndarray]:
        """Sample ``batch_size`` transitions.

        Returns arrays with leading dimension ``batch_size``: ``observation.*`` and
        ``next.observation.*`` (the true successor's observation; for a terminated or truncated
        step its real final observation), ``action``, ``action.policy``, ``action.operator``,
        ``reward`` (float32), ``terminated``/``truncated``/``is_intervention`` (bool),
        ``policy_version``/``episode_index``/``frame_index`` (int64), ``timestamp``
        (float64, s), ``task``/``robot_id`` (str objects), ``index`` (global row, int64),
        ``source`` (int16: 0 online, k = k-th mounted offline view) and ``weight`` (float32
        importance weight; 1 unless the sampler is prioritized).

        Raises:
            ValueError: nothing to sample (no eligible transition for this sampler).
            RateLimiterTimeout: with a rate limiter, sampling was not allowed in ``timeout``.
        """
        if self.rate_limiter is not None:
            self.rate_limiter.await_sample(batch_size, timeout)
        sampler = sampler or _DEFAULT_SAMPLER
        rng = rng or _rng()
        picks = sampler.sample_indices(self.view(), batch_size, rng)
        parts = []
        for src, rows, weights in picks:
            if len(rows) == 0:
                continue
            order = np.argsort(rows, kind="stable")
            part = src.buffer.read_transitions(rows[order])
            part["source"] = np.full(len(rows), src.source_id, dtype=np.int16)
            part["weight"] = weights[order].astype(np.float32)
            parts.append(part)
        if not parts:
            raise ValueError("nothing to sample")
        if len(parts) == 1:
            return parts[0]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def read_transitions(self, rows: np.ndarray, *, count: bool = True) -> dict[str, np.ndarray]:
        """Transitions at global ``rows`` (eligible rows; see :meth:`sample` for the keys)."""
        snap = self.storage.snapshot()
        chunks, starts, _ = snap
        idx = self.index
        b = idx.base
        with self._lock:
            cols = {k: idx.cols[k] for k in _SCALAR_OUT}
            nxt_col = idx.cols["next_row"]
        li = rows - b
        done = cols["terminated"][li] | cols["truncated"][li]
        nxt = np.where(done, rows, nxt_col[li])
        obs_names = list(self.schema.observations)
        n = len(rows)
        specs = {k: ((n, *f.shape), f.dtype) for k, f in self.schema.payload.items()}
        specs.update(
            {
                FINAL_PREFIX + k: ((n, *f.shape), f.dtype)
                for k, f in self.schema.observations.items()
            }
        )
        block = out_arrays(specs)
        out = self.storage.gather(rows, list(self.schema.payload), snap, count=count, out=block)
        nobs = self.storage.gather(
            nxt, obs_names, snap, count=False, out={k: block[FINAL_PREFIX + k] for k in obs_names}
        )
        if done.any():
            finals = self.storage.finals_for(rows[done], chunks, starts)
            for pos in np.flatnonzero(done):
                f = finals.get(int(rows[pos]))
                if f is not None:
                    for k, v in f.items():
                        nobs[k][pos] = v
        for k in _SCALAR_OUT:
            out[k] = cols[k][li]
        out["task"] = np.asarray(idx.tasks.names, dtype=object)[idx.cols["task"][li]]
        out["robot_id"] = np.asarray(idx.robots.names, dtype=object)[idx.cols["robot"][li]]
        out["index"] = rows.astype(np.int64)
        return out

    def sample_sequences(
        self,
        batch_size: int,
        length: int,
        *,
        history: int = 0,
        sampler: Sampler | None = None,
        rng: np.random.Generator | None = None,
        timeout: float | None = None,
    ) -> dict[str, np.ndarray]:
        """Sample sequences for action chunks, n-step returns and frame stacks.

        Each sequence starts at a sampled step ``t`` and covers steps ``t - history`` ..
        ``t + length - 1`` of the SAME episode, following true successor/predecessor links
        (forward only through transitions whose successor is stored, so the newest step of a
        still-running episode never ends a sequence).
        Positions past either end of the episode repeat the nearest valid step and are marked
        ``False`` in ``mask`` (like LeRobot's ``action_is_pad``); nothing crosses an episode
        boundary.

        Returns:
            Per-step keys of :meth:`sample` with shape ``(B, history + length, ...)``, plus
            ``mask`` (bool ``(B, history + length)``), ``next.observation.*`` ``(B, ...)``
            (successor of the LAST valid step: what an n-step target bootstraps from),
            ``bootstrap_terminated`` (bool ``(B,)``, the last valid step terminated),
            ``index`` ``(B,)`` (start rows), ``source`` and ``weight`` ``(B,)``.

        Raises:
            ValueError: ``length < 1`` or ``history < 0``, or nothing to sample.
        """
        if length < 1 or history < 0:
            raise ValueError(f"need length >= 1 and history >= 0, got {length}, {history}")
        if self.rate_limiter is not None:
            self.rate_limiter.await_sample(batch_size, timeout)
        sampler = sampler or _DEFAULT_SAMPLER
        rng = rng or _rng()
        parts = []
        for src, rows, weights in sampler.sample_indices(self.view(), batch_size, rng):
            if len(rows) == 0:
                continue
            part = src.buffer._read_sequences(np.sort(rows), length, history)
            part["source"] = np.full(len(rows), src.source_id, dtype=np.int16)
            part["weight"] = weights[np.argsort(rows, kind="stable")].astype(np.float32)
            parts.append(part)
        if not parts:
            raise ValueError("nothing to sample")
        if len(parts) == 1:
            return parts[0]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def _read_sequences(
        self, starts: np.ndarray, length: int, history: int
    ) -> dict[str, np.ndarray]:
        idx = self.index
        b = idx.base
        with self._lock:
            nxt_col, prv_col = idx.cols["next_row"], idx.cols["prev_row"]
            term, trunc = idx.cols["terminated"], idx.cols["truncated"]
            elig = idx.cols["eligible"]
            visible = self.visible
        B, T = len(starts), history + length
        grid = np.empty((B, T), dtype=np.int64)
        mask = np.ones((B, T), dtype=bool)
        grid[:, history] = starts
        cur = starts.copy()
        ok = np.ones(B, dtype=bool)
        for j in range(history - 1, -1, -1):
            p = prv_col[cur - b]
            ok &= p >= b
            cur = np.where(ok, p, cur)
            grid[:, j] = cur
            mask[:, j] = ok
        cur = starts.copy()
        ok = np.ones(B, dtype=bool)
        for j in range(history + 1, T):
            li = cur - b
            n = nxt_col[li]
            ok &= ~(term[li] | trunc[li]) & (n >= 0) & (n < visible)
            # Only steps whose own successor is known, so the last one can bootstrap.
            ok &= elig[np.where(ok, n, cur) - b]
            cur = np.where(ok, n, cur)
            grid[:, j] = cur
            mask[:, j] = ok
        flat = grid.reshape(-1)
        snap = self.storage.snapshot()
        out = self.storage.gather(flat, list(self.schema.payload), snap)
        res: dict[str, np.ndarray] = {k: v.reshape((B, T, *v.shape[1:])) for k, v in out.items()}
        li = flat - b
        for k in _SCALAR_OUT:
            res[k] = idx.cols[k][li].reshape(B, T)
        res["task"] = np.asarray(idx.tasks.names, dtype=object)[idx.cols["task"][li]].reshape(B, T)
        robots = np.asarray(idx.robots.names, dtype=object)
        res["robot_id"] = robots[idx.cols["robot"][li]].reshape(B, T)
        res["mask"] = mask
        last = grid[np.arange(B), history + mask[:, history:].sum(axis=1) - 1]
        # A step past the episode end never came; the last valid one bootstraps.
        tail = self.read_transitions(last, count=False)
        for k in self.schema.observations:
            res[FINAL_PREFIX + k] = tail[FINAL_PREFIX + k]
        res["bootstrap_terminated"] = tail["terminated"]
        res["index"] = starts.astype(np.int64)
        return res

    # ------------------------------------------------------------------ reuse --------
    def mount(
        self,
        source: str | Path | ReplayBuffer,
        *,
        tasks: list[str] | None = None,
        robot_ids: list[str] | None = None,
        run_ids: list[str] | None = None,
        policy_versions: tuple[int, int] | list[int] | None = None,
        interventions_only: bool = False,
        name: str | None = None,
    ) -> OfflineView:
        """Mount earlier data (another buffer directory, or this one) as offline data.

        Nothing is copied: the other directory is opened read-only and its segments are
        memory-mapped. Filters combine with AND; ``policy_versions`` is an inclusive
        ``(min, max)`` tuple or a list of versions.

        Raises:
            ValueError: the source's columns differ from this buffer's.
        """
        other = source if isinstance(source, ReplayBuffer) else None
        if other is None:
            other = ReplayBuffer.open(
                source,  # type: ignore[arg-type]
                settings=self.settings.model_copy(update={"prefetch": False}),
                read_only=True,
            )
        if not other.schema.same_columns(self.schema):
            raise ValueError(f"{other.directory}: its step schema differs from this buffer's")
        filters = {
            "tasks": tasks,
            "robot_ids": robot_ids,
            "run_ids": run_ids,
            "policy_versions": policy_versions,
            "interventions_only": interventions_only,
        }
        lo, hi = other.first_row, other.visible
        rows = other.index.select(lo, hi, **filters)  # type: ignore[arg-type]
        view = OfflineView(name or str(other.directory), other, rows, filters)
        with self._lock:
            self.offline.append(view)
        return view

    def select(self, **filters: Any) -> np.ndarray:
        """Eligible global rows of this buffer (all stored, not just the window) matching
        ``tasks``, ``robot_ids``, ``run_ids``, ``policy_versions``, ``interventions_only``."""
        return self.index.select(self.first_row, self.visible, **filters)

    def index_summary(self) -> dict[str, Any]:
        """Episodes, tasks, robots, policy versions, intervention counts, segment offsets."""
        with self._lock:
            segs = [(f, n, str(p)) for f, n, p in self.sealed_segments]
            return self.index.summary(segs)

    # ------------------------------------------------------------------ metrics ------
    def stats(self) -> dict[str, float | int]:
        """Metrics: ``size_transitions``, ``steps``, ``bytes_on_disk``, ``bytes_in_cache``
        (hot tier), ``cold_resident_bytes`` (estimate), ``cache_hit_rate`` (share of sampled
        rows served from RAM, 0..1), ``prefetch_lag_s`` (age of the oldest pending prefetch
        request), ``segments``, ``hot_segments``, ``wal_fsyncs``, ``ack_latency_p50_s``,
        ``ack_latency_p99_s``, ``recovery_seconds``."""
        s = self.storage
        with self._lock:
            disk = 0
            for p in self.directory.glob("*"):
                if p.is_file():
                    disk += p.stat().st_size
            served = s.hits + s.misses
            lat = np.asarray(self._ack_latencies[-10_000:], dtype=np.float64)
            return {
                "size_transitions": len(self),
                "steps": self.num_steps,
                "bytes_on_disk": disk,
                "bytes_in_cache": s.hot_bytes(),
                "cold_resident_bytes": max(s.cold_touched, 0),
                "cache_hit_rate": (s.hits / served) if served else 1.0,
                "prefetch_lag_s": s.current_prefetch_lag() or s.prefetch_lag_s,
                "segments": len(self.sealed_segments),
                "hot_segments": sum(1 for c in s.chunks if c.hot and c.sealed),
                "wal_fsyncs": self._wal.fsync_count if self._wal else 0,
                "ack_latency_p50_s": float(np.percentile(lat, 50)) if lat.size else 0.0,
                "ack_latency_p99_s": float(np.percentile(lat, 99)) if lat.size else 0.0,
                "recovery_seconds": self.recovery_seconds,
            }

    # ------------------------------------------------------------------ closing ------
    def close(self) -> None:
        """Finish queued seals, seal the open tail, stop threads, release the directory.

        After ``close`` every stored row is in a sealed segment (no WAL to replay on the next
        open); appends still waiting for their fdatasync complete first.
        """
        if self._closed:
            return
        if not self.read_only:
            self.flush()
        with self._lock:
            self._closed = True
            while self._unwritten:  # appends given rows are still writing their record
                self._seal_cond.wait(0.05)
        self._stop.set()
        with self._lock:
            self._seal_cond.notify_all()
        for t in self._threads:
            t.join(timeout=10)
        if self._wal is not None:
            self._wal.close()
            self._seal_tail()
        if self.rate_limiter is not None:
            self.rate_limiter.close()
        for v in self.offline:
            if v.buffer is not self:
                v.buffer.close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def _seal_tail(self) -> None:
        """Seal the open tail's WAL files (closed and fdatasynced) as the last segment."""
        assert self._wal is not None
        with self._lock:
            while self.visible < self.index.end and self._failed is None:
                self._seal_cond.wait(0.05)  # appends between fdatasync and publish
            tail, end = self._tail, self.visible
            paths = self._wal.paths
        if self._failed is not None or tail is None or self._seal_queue:
            return  # leave the WAL for recovery to replay
        if end > tail.first_row:
            tail.n = end - tail.first_row
            tail.sealed = False
            self._seal_queue.append((tail, paths))
            self._seal_one(tail, paths)
        else:
            for p in paths:
                p.unlink(missing_ok=True)
            fsync_dir(self.directory)

    def __enter__(self) -> ReplayBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_INDEX_COLUMNS = [
    "seq",
    "robot_id",
    "run_id",
    "task",
    "episode_index",
    "frame_index",
    "timestamp",
    "reward",
    "terminated",
    "truncated",
    "is_intervention",
    "policy_version",
]
_SCALAR_OUT = (
    "reward",
    "terminated",
    "truncated",
    "is_intervention",
    "policy_version",
    "episode_index",
    "frame_index",
    "timestamp",
)
_DEFAULT_SAMPLER = UniformSampler()
_thread_rng = threading.local()


def _keep_only(path: Path, recs: list[WalRecord], kept: set[int]) -> None:
    """Make WAL file ``path`` hold exactly its records whose first row is in ``kept``, durably.

    Appends write their records outside the buffer lock, so a file's records need not be in
    row order: a dropped record (after a gap) may sit before a kept one. Then the file is
    rewritten (temp file, fdatasync, rename); otherwise it is truncated after the last kept
    record (dropping a torn tail).
    """
    keep = [r for r in recs if r.first_row in kept]
    n = len(keep)
    if all(a is b for a, b in zip(recs[:n], keep, strict=True)):  # a prefix of the file
        size = keep[-1].end if keep else 0
        fd = os.open(path, os.O_RDWR)
        try:
            if os.fstat(fd).st_size != size:
                os.ftruncate(fd, size)
            os.fdatasync(fd)
        finally:
            os.close(fd)
        return
    first_row = int(path.stem.split("-")[1])
    tmp = path.with_suffix(".log.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, FILE_HEADER.pack(FILE_MAGIC, first_row))
        for r in keep:
            for part in (record_header(r.first_row, r.payload), r.payload):
                view = memoryview(part)
                while view:
                    view = view[os.write(fd, view) :]
        os.fdatasync(fd)
    finally:
        os.close(fd)
    replace_durably(tmp, path)


def _stripe_of(path: Path) -> int:
    """The stripe number of a WAL (``wal-<first>-<stripe>.log``) or sealed file name."""
    return int(path.name.split(".")[0].split("-")[-1])


def _rng() -> np.random.Generator:
    g = getattr(_thread_rng, "g", None)
    if g is None:
        g = _thread_rng.g = np.random.default_rng()
    return g


def _encode_ipc(batch: pa.RecordBatch) -> memoryview:
    """One Arrow IPC record batch message (no schema: the directory's schema is fixed)."""
    return memoryview(batch.serialize())


def _decode_ipc(payload: bytes, schema: pa.Schema) -> pa.RecordBatch:
    return ipc.read_record_batch(pa.py_buffer(payload), schema)
