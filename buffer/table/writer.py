"""The writer: the durable insert path of one buffer (validate, log, publish, acknowledge).

Three parts, one job each: :class:`Admission` stages an append (validated, de-duplicated,
admitted by the rate limiter, given rows under the lock); :class:`GroupCommit` writes it to
its WAL stripe and into the open tail WITHOUT the lock and shares one fdatasync among the
appends waiting on a stripe; :class:`Watermark` makes rows visible only when the durable
watermark passes them (every row below it is fdatasynced, so recovery, which keeps the
contiguous prefix of the stripes, has every acknowledged row). The writer composes them and
owns the WAL, the open tail (rotation) and failures.

A failed write or fdatasync (a full disk) fails its append and every append given rows after
it (the watermark cannot pass the gap); appends are refused (:class:`DiskFullError` for
``ENOSPC``/``EDQUOT``) until the next append finds no append in flight and recovers in place:
the rows above the watermark (never acknowledged) leave the index and the WAL stripes, and
appends proceed. So the buffer takes appends again by itself once space is back.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from buffer.columns import StepColumns
from buffer.errors import BufferClosedError, DiskFullError, out_of_space
from buffer.files.wal import StripedWal
from buffer.sampling.rate_limiter import RateLimiter
from buffer.table.ack_phases import AckPhases
from buffer.table.admission import Admission, Joint
from buffer.table.chunks import Chunk, ColdArrays
from buffer.table.claim import AppendResult, Claim
from buffer.table.commit import GroupCommit
from buffer.table.sealer import Sealer
from buffer.table.state import TableState
from buffer.table.tail_reads import WalTailReader
from buffer.table.watermark import Watermark
from foundation.durable import fsync_dir


class Writer:
    """Appends of one writable buffer. ``wal`` and the open ``tail`` exist after :meth:`start`.

    Args:
        state: the buffer's shared state.
        sealer: takes full tails (and gives the spare one).
        rate_limiter: when given, every insert is admitted by it.
    """

    def __init__(self, state: TableState, sealer: Sealer, rate_limiter: RateLimiter | None) -> None:
        self.state = state
        self.sealer = sealer
        self.rate_limiter = rate_limiter
        self.wal: StripedWal | None = None
        self.tail: Chunk | None = None
        self.failed: BaseException | None = None  # rows given out can no longer be durable
        self.recoveries = 0  # recoveries from a failure (rows above the watermark dropped)
        self.recovered_from: BaseException | None = None  # the last one's failure
        self.ack_latencies: list[float] = []
        self.ack_phases = AckPhases()  # where the latency of appends that wrote went
        self.unwritten = 0  # appends given rows whose WAL record is not written yet
        self.claimed = 0  # appends given rows that have not returned or raised yet
        self.rotating = False  # an append is switching the WAL files (outside the lock)
        self.watermark = Watermark(self)
        self.group_commit = GroupCommit(self, self.watermark)
        self.admission = Admission(self)

    def start(self) -> None:
        """Open a fresh WAL and tail after the recovered rows."""
        st = self.state
        self.wal = StripedWal(
            st.directory, st.visible, st.settings.group_commit_max_delay_s, st.settings.wal_stripes
        )
        self.watermark.mark = st.visible
        self.group_commit.start()
        self.tail = st.storage.new_tail(
            st.visible, st.rows_per_segment, reader=self._tail_reader(st.visible)
        )

    def _tail_reader(self, first_row: int) -> WalTailReader | None:
        """The reader of a new tail's large columns from the current WAL files (None when the
        schema has none: the tail then holds every column)."""
        assert self.wal is not None
        large = self.state.storage.large
        return WalTailReader(self.wal.paths, first_row, large) if large else None

    def can_accept(self, n: int = 1) -> bool:
        """Whether an append of ``n`` records would proceed now (for uplink backpressure)."""
        if self.state.closed or self.state.read_only:
            return False
        return self.rate_limiter is None or self.rate_limiter.can_insert(n)

    def append(
        self,
        records: pa.RecordBatch | pa.Table | Sequence[Mapping[str, Any]],
        timeout: float | None,
    ) -> AppendResult:
        """``ReplayBuffer.append`` (see there for arguments, result and errors).

        The append is staged (validated, de-duplicated, admitted, given rows) by
        :class:`Admission`, possibly on another appending thread; then this thread writes it
        to its WAL stripe and the tail and waits for its fdatasync (:class:`GroupCommit`) and
        its visibility (:class:`Watermark`).
        """
        t0 = time.perf_counter()
        st = self.state
        if st.closed or st.read_only or self.wal is None:
            raise BufferClosedError(f"{st.directory}: buffer is closed or read-only")
        if not isinstance(records, pa.RecordBatch | pa.Table):
            records = st.schema.batch_from_records(list(records))
        ticket = self.admission.admit(records, timeout)
        if ticket.result is not None:  # empty, or a merged append's member (done)
            if ticket.joint is not None:
                self._note_latency(t0)
            return ticket.result
        if ticket.joint is not None:
            return self._append_joint(ticket.joint, t0)
        claim, cols = ticket.claim, ticket.cols
        assert claim is not None and cols is not None
        try:
            acked = self._store(claim, cols, t0)
            n_new = claim.new.num_rows
            n_dup = int(cols.n - n_new)
            self._note_latency(t0)
            return AppendResult(acked, n_new, n_dup, (claim.first, claim.end))
        finally:
            self.admission.release(claim)

    def _store(self, claim: Claim, cols: StepColumns, t0: float) -> dict[str, int]:
        """Write a staged claim, wait for its fdatasync and visibility; its ``acked``.
        ``t0``: when its append was called (for :attr:`ack_phases`)."""
        if claim.new.num_rows:
            staged = time.perf_counter()
            lsn = self.group_commit.write(claim)
            written = time.perf_counter()
            acked, durable = self.group_commit.commit(claim, cols, lsn)
            self.ack_phases.add(t0, staged, written, durable, time.perf_counter())
        else:
            acked = self.watermark.acknowledge(claim, cols)
        claim.limited = 0  # stored: the rate limiter keeps counting these inserts
        return acked

    def _note_latency(self, t0: float) -> None:
        self.ack_latencies.append(time.perf_counter() - t0)
        if len(self.ack_latencies) > 100_000:
            del self.ack_latencies[:50_000]

    def _append_joint(self, joint: Joint, t0: float) -> AppendResult:
        """The last member of a merged append: store it, then wake every other member with
        its result (or with the error, which this member raises too)."""
        others = joint.members[:-1]
        try:
            results = joint.results(self._store(joint.claim, joint.cols, t0))
        except BaseException as exc:
            for m in others:
                m.error = exc
            raise
        else:
            for m, r in zip(others, results, strict=False):
                m.result = r
        finally:
            try:
                self.admission.release(joint.claim)
            finally:
                for m in others:
                    m.wake()
        self._note_latency(t0)
        return results[-1]

    def rotate(self, full: Chunk, first: int) -> None:
        """Close the WAL files of the full tail ``full`` (every row of it written) and
        continue in new ones from row ``first``, WITHOUT the buffer lock: a rotation costs
        several fdatasyncs, and appends past their write keep publishing and
        acknowledging meanwhile; claims wait (:attr:`rotating`).

        Raises:
            DiskFullError / OSError: a new file could not be made; nothing changed.
        """
        st = self.state
        assert self.wal is not None
        try:
            old = self.wal.rotate(first)
        except BaseException as exc:
            with st.lock:
                self.rotating = False
                st.cond.notify_all()
            if isinstance(exc, OSError):
                self.raise_disk_full(exc)
            raise
        with st.lock:
            self.group_commit.synced_all()  # the rotation synced every record written
            full.n = first - full.first_row
            self.sealer.enqueue(full, old)
            self.tail = self._new_tail(st.rows_per_segment)
            self.rotating = False
            st.cond.notify_all()

    def fail(self, exc: BaseException) -> None:
        """Note the first failure: rows given out can no longer be durable (locked)."""
        if self.failed is None:
            self.failed = exc
        self.state.cond.notify_all()
        self.watermark.visibility.wake_all()

    def raise_disk_full(self, exc: BaseException) -> None:
        """Raise :class:`DiskFullError` when ``exc`` is the file system running out of space."""
        if out_of_space(exc):
            raise DiskFullError(self.state.directory, exc) from exc

    def refusal(self) -> OSError:
        """What an append raises while the failure noted is not recovered from."""
        failed = self.failed
        if out_of_space(failed):
            return DiskFullError(self.state.directory, failed)
        return OSError(f"write-ahead log failed: {failed}")

    def dropped_meanwhile(self) -> OSError:
        """What a pure retry raises when a recovery ran while it waited (locked)."""
        failed = self.recovered_from
        if out_of_space(failed):
            return DiskFullError(self.state.directory, failed)
        return OSError(
            f"{self.state.directory}: write-ahead log failed ({failed}) while this append "
            "waited for the rows it duplicates; they may have been dropped (never "
            "acknowledged): retry it"
        )

    def _sealing_refusal(self) -> OSError:
        """What an append raises while the sealer cannot seal the queued tail (locked)."""
        failed = self.sealer.failed
        assert failed is not None
        if isinstance(failed, OSError) and out_of_space(failed):
            return DiskFullError(self.state.directory, failed)
        return OSError(
            f"{self.state.directory}: the full tail cannot be sealed ({failed}); nothing of "
            "this batch was stored; appends are taken again once a seal succeeds (retried)"
        )

    def recover(self) -> None:
        """Take appends again after a failure: once no append given rows is in flight (they
        fail or finish quickly), drop the rows above the durable watermark (never
        acknowledged) from the WAL stripes and the index. Nothing acknowledged is touched.

        Raises:
            DiskFullError / OSError: a stripe could not be cleaned (appends stay refused).
        """
        st = self.state
        assert self.wal is not None and self.tail is not None
        with st.lock:
            while self.claimed or self.unwritten or self.rotating:
                st.cond.wait(0.05)
            if self.failed is None:
                return  # another append recovered meanwhile
            end = self.watermark.mark
            try:
                self.wal.reset(end)
            except OSError as exc:
                self.raise_disk_full(exc)
                raise
            st.index.truncate(end)
            self.watermark.durable.clear()  # only appends above the watermark were left there
            for unsynced in self.group_commit.unsynced:  # their appends failed and returned
                unsynced.clear()
            tail = self.tail
            tail.finals = {r: v for r, v in tail.finals.items() if r < end}
            if isinstance(tail.arrays, ColdArrays):
                # The reset may have rewritten a stripe (records moved): read them anew.
                schema = st.schema.arrow_schema
                reader = WalTailReader.scan(
                    self.wal.paths, tail.first_row, st.storage.large, schema, end
                )
                arrays = ColdArrays(reader)
                arrays.update(tail.arrays)
                tail.arrays = arrays
            self.recovered_from, self.failed = self.failed, None
            self.recoveries += 1
            st.cond.notify_all()

    def tail_for(self, n: int) -> Chunk | None:
        """The open tail with room for ``n`` rows, or None when the full tail must be rotated
        by the caller (locked). A batch larger than a tail rotates here, under the lock."""
        st = self.state
        assert self.tail is not None and self.wal is not None
        while True:
            if self.failed is not None:
                raise self.refusal()  # never rotate past rows that cannot become durable
            if st.closed:
                raise BufferClosedError(f"{st.directory}: buffer closed")
            if self.rotating:  # another append is rotating; its new tail comes next
                st.cond.wait(0.05)
                continue
            tail = self.tail
            used = st.index.end - tail.first_row
            if used + n <= tail.capacity:
                return tail
            if self.unwritten:
                # Rows already given out must be in the old WAL files before they close.
                st.cond.wait(0.05)
                continue
            if not (used and self.sealer.queue) or st.stop.is_set():
                break
            # An unsealed tail cannot be evicted: with one still queued, wait for its seal
            # (a rename, milliseconds) rather than let the hot tier overshoot the budget;
            # a seal that is failing refuses the append instead (nothing is claimed yet).
            if self.sealer.failed is not None:
                raise self._sealing_refusal()
            st.cond.wait(0.05)
        if used > 0 and n <= st.rows_per_segment:
            return None  # the caller rotates (outside the lock) and claims again
        if used > 0:  # a batch larger than a tail: rotate here, then a tail that fits it
            try:
                old = self.wal.rotate(st.index.end)
            except OSError as exc:  # nothing changed: this append is refused, no rows given
                self.raise_disk_full(exc)
                raise
            self.group_commit.synced_all()
            tail.n = used
            self.sealer.enqueue(tail, old)
        else:
            st.storage.remove_chunks([tail])
        self.tail = self._new_tail(max(st.rows_per_segment, n))
        st.cond.notify_all()
        return self.tail

    def _new_tail(self, cap: int) -> Chunk:
        """A tail of ``cap`` rows at the index's end: the sealer's spare when big enough."""
        st = self.state
        spare = self.sealer.take_spare()
        if spare is not None and len(spare["action"]) < cap:
            spare = None
        if spare is None:
            # No pre-faulted spare (the sealer may be allocating one; that stays counted):
            # make room for a fresh tail first, so the peak stays inside the budget.
            extra = cap * st.storage.tail_row_bytes
            st.storage.spare_bytes += extra
            st.storage.enforce_budget()
            st.storage.spare_bytes -= extra
        return st.storage.new_tail(st.index.end, cap, spare, self._tail_reader(st.index.end))

    def close(self) -> None:
        """Close the WAL and seal the open tail as the last segment (threads stopped first).

        Waits for appends between fdatasync and publish; after a WAL failure, or with a seal
        still queued, the WAL stays for recovery to replay.
        """
        st = self.state
        assert self.wal is not None
        self.wal.close()
        with st.lock:
            if self.failed is None:
                self.group_commit.synced_all()  # close synced every record written
            while st.visible < st.index.end and self.failed is None:
                st.cond.wait(0.05)  # appends between fdatasync and publish
            tail, end = self.tail, st.visible
            paths = self.wal.paths
        if self.failed is not None or tail is None or self.sealer.queue:
            return  # leave the WAL for recovery to replay
        if end > tail.first_row:
            tail.n = end - tail.first_row
            with st.lock:
                self.sealer.enqueue(tail, paths)
            self.sealer.seal(tail, paths)
        else:
            for p in paths:
                p.unlink(missing_ok=True)
            fsync_dir(st.directory)

    def wait_written(self) -> None:
        """Wait until appends given rows have written their records and no rotation is in
        flight (locked; ``close``)."""
        while self.unwritten or self.rotating:
            self.state.cond.wait(0.05)
