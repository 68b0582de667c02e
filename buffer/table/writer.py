"""The writer: the durable insert path of one buffer (validate, log, publish, acknowledge).

An append is staged by the combiner (``buffer.table.combiner``: one thread stages the waiting
appends one at a time, which costs less Python under the GIL than 8 threads at once):
validated whole, de-duplicated against the index, admitted by the rate limiter (an append
with no room waits for it in its own thread, outside the combiner) and given rows under the
lock. Its own thread then writes it to its WAL stripe and into the open tail WITHOUT the lock
(other appends proceed; group commit shares one fdatasync among them). Rows become
visible only when the durable watermark passes them: every row below it is fdatasynced, so
recovery (which keeps the contiguous prefix of the stripes) has every acknowledged row.

A failed write or fdatasync (a full disk) fails its append and every append given rows after
it (the watermark cannot pass the gap); appends are refused (:class:`DiskFullError` for
``ENOSPC``/``EDQUOT``) until the next append finds no append in flight and recovers in place:
the rows above the watermark (never acknowledged) leave the index and the WAL stripes, and
appends proceed. So the buffer takes appends again by itself once space is back.
"""

from __future__ import annotations

import errno
import heapq
import threading
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

import numpy as np
import pyarrow as pa

from buffer.columns import StepColumns
from buffer.errors import (
    BackpressureError,
    BufferClosedError,
    DiskFullError,
    RateLimiterTimeout,
    StepValidationError,
)
from buffer.files.encoding import ipc_message, ipc_pieces, pieces_size
from buffer.files.wal import StripedWal, WriteAheadLog
from buffer.sampling.rate_limiter import RateLimiter
from buffer.table.ack_phases import AckPhases
from buffer.table.combiner import Combiner, Ticket, one_at_a_time
from buffer.table.sealer import Sealer
from buffer.table.state import TableState
from buffer.table.storage import Chunk, ColdArrays
from buffer.table.tail_reads import WalTailReader
from foundation.durable import fsync_dir


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


# Appends of at most this many bytes that wait for the combiner together are merged into
# one (see ``Writer._stage_group``), up to ``_JOINT_MAX_BYTES`` per merged append: their
# fixed costs (validation, de-duplication, index, WAL record, fdatasync, publish, hand-offs)
# are paid once; a camera-sized batch gains nothing from it and would be copied, so stays
# alone.
_MERGE_MAX_BYTES = 256 * 1024
_JOINT_MAX_BYTES = 2 * 1024 * 1024


@dataclass
class _Claim:
    """One append's new records on their way to disk."""

    new: pa.RecordBatch
    cols: StepColumns  # the small columns of ``new``
    wal: WriteAheadLog  # its stripe
    dup: np.ndarray | None = None  # which records of the validated batch were stored before
    recoveries: int = 0  # ``Writer.recoveries`` when it was de-duplicated
    limited: int = 0  # inserts counted by the rate limiter and not yet stored
    announced: bool = True  # its WAL stripe still expects its record (``WriteAheadLog.begin``)
    counted: bool = False  # counted among the appends given rows (``Writer._claimed``)
    first: int = 0
    end: int = 0
    tail: Chunk | None = None


class _Append(Ticket):
    """One call of :meth:`Writer.append` on its way through the combiner."""

    __slots__ = (
        "records",
        "timeout",
        "room",
        "needs_room",
        "result",
        "claim",
        "cols",
        "joint",
    )

    def __init__(self, records: pa.RecordBatch | pa.Table, timeout: float | None) -> None:
        super().__init__()
        self.records = records
        self.timeout = timeout
        self.room = 0  # inserts the rate limiter admitted ahead (outside the combiner)
        self.needs_room = 0  # staging found no room for this many inserts
        self.result: AppendResult | None = None  # set when empty, or by a merged append
        self.claim: _Claim | None = None
        self.cols: StepColumns | None = None
        self.joint: _Joint | None = None  # the merged append it is part of


class _Joint:
    """Several appends merged into one claim (``Writer._stage_group``); the last member
    writes and commits it and then gives every other member its result, or the error."""

    __slots__ = ("claim", "cols", "members")

    def __init__(self, claim: _Claim, cols: StepColumns, members: list[_Append]) -> None:
        self.claim, self.cols, self.members = claim, cols, members

    def results(self, acked: dict[str, int]) -> list[AppendResult]:
        """Each member's result, from the merged append's per-robot ``acked``."""
        claim, cols = self.claim, self.cols
        out, off, first = [], 0, claim.first
        for m in self.members:
            n = m.records.num_rows
            new = n if claim.dup is None else n - int(np.count_nonzero(claim.dup[off : off + n]))
            robots = (
                [cols.robot.names[0]]
                if cols.robot.single
                else [cols.robot.names[c] for c in np.unique(cols.robot.codes[off : off + n])]
            )
            mine = {r: acked[r] for r in robots if r in acked}
            out.append(AppendResult(mine, new, n - new, (first, first + new)))
            off, first = off + n, first + new
        return out


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
        self._recovered_from: BaseException | None = None  # the last one's failure
        self.ack_latencies: list[float] = []
        self.ack_phases = AckPhases()  # where the latency of appends that wrote went
        self._watermark = 0  # every row below it is durable
        self._durable: dict[int, int] = {}  # synced appends above the watermark: first -> end
        self._unwritten = 0  # appends given rows whose WAL record is not written yet
        self._claimed = 0  # appends given rows that have not returned or raised yet
        self._rotating = False  # an append is switching the WAL files (outside the lock)
        self._visibility = _Wakeups()  # appends waiting for their rows to become visible
        self._unsynced: list[list[_Unsynced]] = []  # per stripe: written, not known durable
        self._combiner: Combiner[_Append] = Combiner(self._stage_group)
        self.appends = 0  # appends staged with records (alone or merged)
        self.merged_appends = 0  # of them, staged as part of a merged one (``_stage_group``)

    def start(self) -> None:
        """Open a fresh WAL and tail after the recovered rows."""
        st = self.state
        self.wal = StripedWal(
            st.directory, st.visible, st.settings.group_commit_max_delay_s, st.settings.wal_stripes
        )
        self._watermark = st.visible
        self._unsynced = [[] for _ in self.wal.logs]
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

        The append is staged (validated, de-duplicated, admitted, given rows) by the
        combiner (``buffer.table.combiner``), possibly on another appending thread; then this
        thread writes it to its WAL stripe and the tail and waits for its fdatasync and its
        visibility.
        """
        t0 = time.perf_counter()
        st = self.state
        if st.closed or st.read_only or self.wal is None:
            raise BufferClosedError(f"{st.directory}: buffer is closed or read-only")
        if not isinstance(records, pa.RecordBatch | pa.Table):
            records = st.schema.batch_from_records(list(records))
        ticket = _Append(records, timeout)
        while True:
            self._combiner.submit(ticket)
            if ticket.error is not None:
                if ticket.room and self.rate_limiter is not None:
                    # Admitted ahead, then refused before staging counted it: give it back.
                    self.rate_limiter.undo_insert(ticket.room)
                    ticket.room = 0
                raise ticket.error
            if not ticket.needs_room:
                break
            self._await_room(ticket)  # outside the combiner: other appends go on
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
            self._release(claim)

    def _store(self, claim: _Claim, cols: StepColumns, t0: float) -> dict[str, int]:
        """Write a staged claim, wait for its fdatasync and visibility; its ``acked``.
        ``t0``: when its append was called (for :attr:`ack_phases`)."""
        if claim.new.num_rows:
            staged = time.perf_counter()
            lsn = self._write(claim)
            written = time.perf_counter()
            acked, durable = self._commit(claim, cols, lsn)
            self.ack_phases.add(t0, staged, written, durable, time.perf_counter())
        else:
            acked = self._acknowledge(claim, cols)
        claim.limited = 0  # stored: the rate limiter keeps counting these inserts
        return acked

    def _note_latency(self, t0: float) -> None:
        self.ack_latencies.append(time.perf_counter() - t0)
        if len(self.ack_latencies) > 100_000:
            del self.ack_latencies[:50_000]

    def _append_joint(self, joint: _Joint, t0: float) -> AppendResult:
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
                self._release(joint.claim)
            finally:
                for m in others:
                    m.wake()
        self._note_latency(t0)
        return results[-1]

    def _stage_group(self, group: list[_Append], staged: Callable[[_Append], None]) -> None:
        """Stage the combiner's group (``buffer.table.combiner``): the small appends in it are
        merged into one when they can be (:meth:`_stage_joint`), the others, and all of them
        when merging fails (a bad batch, a seq out of order, no room in the rate limiter: each
        alone then gets its own error), one at a time (:meth:`_stage`).

        A merged append is written by its last member, so it is staged last when that is the
        combiner's own (which writes only after the group: a later stage may wait for its
        rows to be written), first otherwise (its writer starts at once).
        """
        own = group[-1]
        joint = _mergeable(group)
        alone = [t for t in group if not any(t is j for j in joint)]
        each = one_at_a_time(self._stage)
        if joint and joint[-1] is own:
            each(alone, staged)
            if not self._stage_joint(joint, staged):
                each(joint, staged)
            return
        if joint and not self._stage_joint(joint, staged):
            alone = group
        each(alone, staged)

    def _stage_joint(self, members: list[_Append], staged: Callable[[_Append], None]) -> bool:
        """Stage ``members`` as one append; False, with nothing claimed, when they must be
        staged one at a time instead (any error: each alone names its own)."""
        st = self.state
        try:
            batch, cols = st.schema.validate_columns(
                pa.concat_batches([m.records for m in members])  # type: ignore[misc]
            )
        except Exception:  # noqa: BLE001 - each member staged alone names what was wrong
            return False
        if st.closed or self.failed is not None or self.wal is None:
            return False  # staged alone, each raises (or recovers) as it should
        wal = self._stripe(cols)
        wal.begin()
        claim: _Claim | None = None
        try:
            claim = self._deduplicated(batch, cols, wal)
            if not self._admitted_now(claim):
                self._release(claim)
                return False
            self._claim_rows(claim)
        except BaseException as exc:  # nothing claimed: staged alone, each raises it
            if claim is None:
                wal.end()
            else:
                self._release(claim)
            if not isinstance(exc, Exception):
                raise
            return False
        joint = _Joint(claim, cols, members)
        for m in members:
            m.joint = joint
        for m in members[:-1]:
            m.parked = True  # woken by the last member once the merged append is stored
        self.appends += len(members)
        self.merged_appends += len(members)
        staged(members[-1])
        return True

    def _admitted_now(self, claim: _Claim) -> bool:
        """Pass the rate limiter with the claim's new records without waiting (counted in
        ``claim.limited``); False when it has no room now."""
        n = claim.new.num_rows
        if self.rate_limiter is None or not n:
            return True
        try:
            self.rate_limiter.await_insert(n, 0)
        except RateLimiterTimeout:
            return False
        claim.limited = n
        return True

    def _stage(self, ticket: _Append) -> None:
        """Everything of an append before its fdatasync (run by the combiner, one append at
        a time): validate, de-duplicate, pass the rate limiter, claim rows. Fills
        ``ticket``; raises what the append must raise."""
        st = self.state
        batch, cols = st.schema.validate_columns(ticket.records)
        ticket.records = batch  # validated: a retry after the rate limiter skips nothing
        if batch.num_rows == 0:
            ticket.result = AppendResult({}, 0, 0, (st.visible, st.visible))
            return
        if st.closed:
            raise BufferClosedError(f"{st.directory}: buffer closed")
        if self.failed is not None:
            self._recover()
        wal = self._stripe(cols)
        wal.begin()
        claim: _Claim | None = None
        try:
            claim = self._deduplicated(batch, cols, wal)
            if not self._limit(claim, ticket):
                ticket.needs_room = claim.new.num_rows
                self._release(claim)
                return
            self._claim_rows(claim)
        except BaseException:
            if claim is None:
                wal.end()
            else:
                self._release(claim)
            raise
        ticket.claim, ticket.cols, ticket.needs_room = claim, cols, 0
        self.appends += 1

    def _stripe(self, cols: StepColumns) -> WriteAheadLog:
        """The WAL stripe of a batch, by its first robot (spreads robots over the stripes;
        recovery merges them by row id, so a merged batch of several robots may go to any)."""
        assert self.wal is not None
        logs = self.wal.logs
        return logs[zlib.crc32(cols.robot.names[0].encode()) % len(logs)]

    def _release(self, claim: _Claim) -> None:
        """What an append holds when it returns or fails: its stripe's announcement, its
        count among claimed appends, inserts the rate limiter counted and not stored."""
        if claim.announced:
            claim.announced = False
            claim.wal.end()
        if claim.counted:
            claim.counted = False
            st = self.state
            with st.lock:
                self._claimed -= 1
                if not self._claimed:  # only a recovery waits for this
                    st.cond.notify_all()
        if claim.limited and self.rate_limiter is not None:
            self.rate_limiter.undo_insert(claim.limited)
            claim.limited = 0

    def _deduplicated(self, batch: pa.RecordBatch, cols: StepColumns, wal: WriteAheadLog) -> _Claim:
        """A claim of the records of ``batch`` not stored yet; out-of-order seqs are
        refused."""
        st = self.state
        with st.lock:
            dup, bad = st.index.classify_seqs(cols.robot, cols.seq)
            if bad >= 0:
                raise self._out_of_order(cols, bad)
            recoveries = self.recoveries
        if not dup.any():
            return _Claim(batch, cols, wal, recoveries=recoveries)
        return _Claim(batch.filter(pa.array(~dup)), cols.take(~dup), wal, dup, recoveries)

    def _out_of_order(self, cols: StepColumns, bad: int) -> StepValidationError:
        """The refusal of record ``bad``'s seq: at or below its robot's highest stored seq,
        never stored (locked)."""
        robot, seq = cols.robot.value(bad), int(cols.seq[bad])
        last = self.state.index.last_seq(robot)
        return StepValidationError(
            f"record {bad} (robot_id={robot!r}, seq={seq}): field "
            f"'seq' is out of order (robot's highest stored seq is {last}, and this "
            "seq was never stored)",
            record=bad,
            field="seq",
            robot_id=robot,
            seq=seq,
        )

    def _limit(self, claim: _Claim, ticket: _Append) -> bool:
        """Pass the rate limiter with the new records (counted in ``claim.limited``) without
        waiting: False when it has no room now, and the caller waits for it (see
        :meth:`_await_room`) outside the combiner, so other appends are not held up. Room
        admitted ahead (``ticket.room``) counts first; what duplicates made spare goes back.

        Raises:
            BackpressureError: no room and ``timeout`` is 0.
        """
        limiter = self.rate_limiter
        room, ticket.room = ticket.room, 0
        if limiter is None:
            return True
        n_new = claim.new.num_rows
        claim.limited = min(room, n_new)
        if room > claim.limited:
            limiter.undo_insert(room - claim.limited)
        if claim.limited == n_new:
            return True
        try:
            limiter.await_insert(n_new - claim.limited, 0)
        except RateLimiterTimeout:
            if ticket.timeout is not None and ticket.timeout <= 0:
                raise self._backpressure(n_new) from None
            return False  # the caller gives back ``claim.limited`` (``_release``)
        claim.limited = n_new
        return True

    def _await_room(self, ticket: _Append) -> None:
        """Wait (in the appending thread) until the rate limiter admits the inserts staging
        found no room for; staged again after.

        Raises:
            BackpressureError: not admitted within the append's ``timeout``.
        """
        assert self.rate_limiter is not None
        n, ticket.needs_room = ticket.needs_room, 0
        try:
            self.rate_limiter.await_insert(n, ticket.timeout)
        except RateLimiterTimeout:
            raise self._backpressure(n) from None
        ticket.room = n

    def _backpressure(self, n: int) -> BackpressureError:
        assert self.rate_limiter is not None
        return BackpressureError(
            f"buffer is ahead of sampling; {n} records not accepted",
            self.rate_limiter.retry_after_s(),
        )

    def _claim_rows(self, claim: _Claim) -> None:
        """Give the new records their rows and the tail they go into (see
        :meth:`_claim_locked`); when the tail is full, this append rotates the WAL first,
        outside the lock (see :meth:`_rotate`), and tries again."""
        while True:
            rotation = self._claim_locked(claim)
            if rotation is None:
                return
            self._rotate(*rotation)

    def _claim_locked(self, claim: _Claim) -> tuple[Chunk, int] | None:
        """Under the lock: claim rows (no other append was staged since
        :meth:`_deduplicated`: the combiner stages one at a time). Returns None once claimed,
        or the full tail and the first row of the next one when this append must rotate."""
        st = self.state
        with st.lock:
            if st.closed:
                raise BufferClosedError(f"{st.directory}: buffer closed")
            if self.failed is not None:
                raise self._refusal()
            claim.first = claim.end = st.index.end
            if claim.new.num_rows:
                tail = self._tail_for(claim.new.num_rows)
                if tail is None:
                    assert self.tail is not None
                    self._rotating = True
                    return self.tail, st.index.end
                claim.tail = tail
                claim.first, claim.end = st.index_rows(claim.cols)
                self._unwritten += 1
                self._claimed += 1
                claim.counted = True
            return None

    def _rotate(self, full: Chunk, first: int) -> None:
        """Close the WAL files of the full tail ``full`` (every row of it written) and
        continue in new ones from row ``first``, WITHOUT the buffer lock: a rotation costs
        several fdatasyncs (tens of ms), and appends past their write keep publishing and
        acknowledging meanwhile; claims wait (``_rotating``).

        Raises:
            DiskFullError / OSError: a new file could not be made; nothing changed.
        """
        st = self.state
        assert self.wal is not None
        try:
            old = self.wal.rotate(first)
        except BaseException as exc:
            with st.lock:
                self._rotating = False
                st.cond.notify_all()
            if isinstance(exc, OSError):
                self._raise_disk_full(exc)
            raise
        with st.lock:
            self._synced_all()  # the rotation synced every record written
            full.n = first - full.first_row
            self.sealer.enqueue(full, old)
            self.tail = self._new_tail(st.rows_per_segment)
            self._rotating = False
            st.cond.notify_all()

    def _write(self, claim: _Claim) -> int:
        """The rows are ours now; encode them (their IPC message: in this thread, since it
        needs no order, it stays off the combiner's serial path), copy them into the WAL and
        the tail WITHOUT the buffer lock (readers and acknowledgements proceed). Nothing
        reads them before they are published, which needs their fdatasync; a rotation waits
        for these writes. Returns the WAL position to sync to."""
        st = self.state
        assert claim.tail is not None
        arrays = claim.tail.arrays
        reader = arrays.seg if isinstance(arrays, ColdArrays) else None  # see tail_reads
        assert reader is None or isinstance(reader, WalTailReader)
        try:
            try:
                if reader is None:
                    lsn = claim.wal.write(claim.first, ipc_pieces(claim.new))
                else:
                    pieces, offsets = ipc_message(claim.new, reader.names)
                    lsn, start = claim.wal.write_record(claim.first, pieces)
            finally:
                claim.announced = False
                claim.wal.end()
            if reader is not None:
                stripe, n = claim.wal.stripe, claim.new.num_rows
                if offsets is None:  # the encoder copied a column: parse what was written
                    size = pieces_size(pieces)
                    reader.add_parsed(claim.first, stripe, start, size, st.schema.arrow_schema)
                else:
                    reader.add(claim.first, stripe, n, [start + o for o in offsets])
            st.storage.write_rows(claim.tail, claim.new, claim.first - claim.tail.first_row)
        except BaseException as exc:
            with st.lock:  # failed before unwritten drops: no rotation passes these rows
                self._unwritten -= 1
                self._fail(exc)
            self._raise_disk_full(exc)
            raise
        with st.lock:
            self._unwritten -= 1
            if not self._unwritten:  # a rotation, a recovery or close waits for this
                st.cond.notify_all()
        return lsn

    def _sync(self, wal: WriteAheadLog, lsn: int) -> None:
        """fdatasync the stripe up to ``lsn`` (group commit: shared with other appends)."""
        try:
            wal.sync(lsn)
        except BaseException as exc:
            with self.state.lock:
                self._fail(exc)
            self._raise_disk_full(exc)
            raise

    def _fail(self, exc: BaseException) -> None:
        """Note the first failure: rows given out can no longer be durable (locked)."""
        if self.failed is None:
            self.failed = exc
        self.state.cond.notify_all()
        self._visibility.wake_all()

    def _raise_disk_full(self, exc: BaseException) -> None:
        """Raise :class:`DiskFullError` when ``exc`` is the file system running out of space."""
        if _out_of_space(exc):
            raise DiskFullError(self.state.directory, exc) from exc

    def _refusal(self) -> OSError:
        """What an append raises while the failure noted is not recovered from."""
        failed = self.failed
        if _out_of_space(failed):
            return DiskFullError(self.state.directory, failed)
        return OSError(f"write-ahead log failed: {failed}")

    def _dropped_meanwhile(self) -> OSError:
        """What a pure retry raises when a recovery ran while it waited (locked)."""
        failed = self._recovered_from
        if _out_of_space(failed):
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
        if isinstance(failed, OSError) and _out_of_space(failed):
            return DiskFullError(self.state.directory, failed)
        return OSError(
            f"{self.state.directory}: the full tail cannot be sealed ({failed}); nothing of "
            "this batch was stored; appends are taken again once a seal succeeds (retried)"
        )

    def _recover(self) -> None:
        """Take appends again after a failure: once no append given rows is in flight (they
        fail or finish quickly), drop the rows above the durable watermark (never
        acknowledged) from the WAL stripes and the index. Nothing acknowledged is touched.

        Raises:
            DiskFullError / OSError: a stripe could not be cleaned (appends stay refused).
        """
        st = self.state
        assert self.wal is not None and self.tail is not None
        with st.lock:
            while self._claimed or self._unwritten or self._rotating:
                st.cond.wait(0.05)
            if self.failed is None:
                return  # another append recovered meanwhile
            end = self._watermark
            try:
                self.wal.reset(end)
            except OSError as exc:
                self._raise_disk_full(exc)
                raise
            st.index.truncate(end)
            self._durable.clear()  # only appends above the watermark were left there
            for unsynced in self._unsynced:  # their appends failed and returned
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
            self._recovered_from, self.failed = self.failed, None
            self.recoveries += 1
            st.cond.notify_all()

    def _commit(self, claim: _Claim, cols: StepColumns, lsn: int) -> tuple[dict[str, int], float]:
        """Wait until this append's rows (written to its stripe up to ``lsn``) are durable
        and every row before them is too (recovery keeps the contiguous prefix of the
        stripes), then acknowledge: ``(acked, when an fdatasync covered its rows)``
        (``time.perf_counter``).

        Group commit with one wake-up per append: the thread that runs a stripe's fdatasync
        (the leader, :meth:`WriteAheadLog.sync`) publishes every record its sync covered
        (:meth:`_synced`) and wakes each append its publish made visible; an append that
        found a leader at work waits on its own event, and when that leader's sync did not
        cover it, the leader hands the lead to the earliest such append. (Before, every
        follower woke on the stripe's condition, took the buffer's lock to publish itself
        and often waited again for earlier rows: two or three hand-offs per append.)

        Raises:
            DiskFullError / OSError: the fdatasync, or one this append's rows wait behind,
                failed (the rows are not acknowledged).
        """
        st, wal = self.state, claim.wal
        me = _Unsynced(lsn, claim.first, claim.end, threading.Event())
        with st.lock:
            self._visibility.add(claim.end, me.woken)
            if wal.synced >= lsn:  # a sync that started after this write covered it
                me.durable_at = time.perf_counter()
                self._durable[claim.first] = claim.end
                self._advance_watermark()
                lead = False
            else:
                self._unsynced[wal.stripe].append(me)
                lead = not wal.syncing  # else that leader publishes or hands the lead on
        while True:
            if lead:
                self._sync(wal, lsn)
                with st.lock:
                    self._synced(wal)
            elif not me.woken.wait(0.5):
                me.lead = True  # no wake-up can be lost for good: sync and publish itself
            with st.lock:
                me.woken.clear()
                if st.visible >= claim.end:
                    return self._acked(cols), me.durable_at
                if self.failed is not None:
                    raise self._refusal()
                lead, me.lead = me.lead, False

    def _synced(self, wal: WriteAheadLog) -> None:
        """Publish the appends of stripe ``wal`` its last fdatasync covered, and hand the
        lead to the earliest one still unsynced when no sync is under way (locked)."""
        unsynced = self._unsynced[wal.stripe]
        if not unsynced:
            return
        synced = wal.synced
        covered = [u for u in unsynced if u.lsn <= synced]
        if covered:
            now = time.perf_counter()
            for u in covered:
                u.durable_at = now
                self._durable[u.first] = u.end
            unsynced[:] = [u for u in unsynced if u.lsn > synced]
            self._advance_watermark()
        if unsynced and not wal.syncing:
            nxt = min(unsynced, key=lambda u: u.lsn)
            nxt.lead = True
            nxt.woken.set()

    def _synced_all(self) -> None:
        """:meth:`_synced` of every stripe (after a rotation or close synced them; locked)."""
        if self.wal is not None:
            for w in self.wal.logs:
                self._synced(w)

    def _acknowledge(self, claim: _Claim, cols: StepColumns) -> dict[str, int]:
        """Acknowledge an append whose records were all stored before (a pure retry) once
        the rows it duplicates (all below ``claim.end``) are visible."""
        st = self.state
        while True:
            with st.lock:
                if self.recoveries != claim.recoveries:
                    # The rows it duplicates may be among those the recovery dropped (never
                    # acknowledged), and later rows may have taken their place: refuse it;
                    # a retry stores what is missing.
                    raise self._dropped_meanwhile()
                if st.visible >= claim.end:
                    return self._acked(cols)
                if self.failed is not None:
                    raise self._refusal()
                # Its own wake-up, not the shared condition: a publish wakes only the
                # appends it made visible (8 writers on one condition cost ~100 context
                # switches per append).
                woken = self._visibility.expect(claim.end)
            woken.wait(0.5)

    def _advance_watermark(self) -> None:
        """Move the durable watermark over contiguous synced appends and publish (locked)."""
        start = self._watermark
        while self._watermark in self._durable:
            self._watermark = self._durable.pop(self._watermark)
        if self._watermark > start:
            self._publish(start, self._watermark)
            self._visibility.wake_upto(self.state.visible)
            self.sealer.rows_visible()
            self.state.cond.notify_all()  # close waits for visibility (rarely anyone else)

    def _publish(self, first: int, end: int) -> None:
        # Called with the durable watermark only: every row below ``end`` is on disk.
        st = self.state
        if end <= st.visible:
            return
        start = min(first, st.visible)
        tail = self.tail
        if tail is not None and tail.first_row <= end <= tail.first_row + tail.capacity:
            tail.n = max(tail.n, end - tail.first_row)
        st.transitions_inserted += st.index.publish(start, end)
        st.visible = end

    def _acked(self, cols: StepColumns) -> dict[str, int]:
        """Per robot of this call: its highest seq among durable (visible) rows."""
        idx, out = self.state.index, {}
        for local, rid in enumerate(cols.robot.names):
            code = idx.robots.codes.get(rid)
            last_row = idx.robot_last_row.get(code) if code is not None else None
            if last_row is not None and last_row < self.state.visible:
                out[rid] = int(idx.cols["seq"][last_row - idx.base])
            elif cols.robot.single:  # a newer row of this robot is in flight: ours are durable
                out[rid] = int(cols.seq.max())
            else:
                out[rid] = int(cols.seq[cols.robot.codes == local].max())
        return out

    def _tail_for(self, n: int) -> Chunk | None:
        """The open tail with room for ``n`` rows, or None when the full tail must be rotated
        by the caller (locked). A batch larger than a tail rotates here, under the lock."""
        st = self.state
        assert self.tail is not None and self.wal is not None
        while True:
            if self.failed is not None:
                raise self._refusal()  # never rotate past rows that cannot become durable
            if st.closed:
                raise BufferClosedError(f"{st.directory}: buffer closed")
            if self._rotating:  # another append is rotating; its new tail comes next
                st.cond.wait(0.05)
                continue
            tail = self.tail
            used = st.index.end - tail.first_row
            if used + n <= tail.capacity:
                return tail
            if self._unwritten:
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
                self._raise_disk_full(exc)
                raise
            self._synced_all()
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
                self._synced_all()  # close synced every record written
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
        while self._unwritten or self._rotating:
            self.state.cond.wait(0.05)


class _Unsynced:
    """An append written to its stripe up to ``lsn`` and not yet known durable."""

    __slots__ = ("lsn", "first", "end", "woken", "lead", "durable_at")

    def __init__(self, lsn: int, first: int, end: int, woken: threading.Event) -> None:
        self.lsn, self.first, self.end, self.woken = lsn, first, end, woken
        self.lead = False  # set with ``woken``: this append runs the stripe's next sync
        self.durable_at = 0.0  # perf_counter when a sync covered it (``ack_phases``)


class _Wakeups:
    """Appends waiting until the visible watermark reaches their end row, each woken alone
    (used under the buffer's lock)."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, threading.Event]] = []
        self._n = 0

    def expect(self, end: int) -> threading.Event:
        """An event set once rows below ``end`` are visible (or on :meth:`wake_all`)."""
        ev = threading.Event()
        self.add(end, ev)
        return ev

    def add(self, end: int, ev: threading.Event) -> None:
        """Set ``ev`` once rows below ``end`` are visible (or on :meth:`wake_all`)."""
        self._n += 1
        heapq.heappush(self._heap, (end, self._n, ev))

    def wake_upto(self, visible: int) -> None:
        while self._heap and self._heap[0][0] <= visible:
            heapq.heappop(self._heap)[2].set()

    def wake_all(self) -> None:
        for _, _, ev in self._heap:
            ev.set()
        self._heap.clear()


def _mergeable(group: list[_Append]) -> list[_Append]:
    """The appends of ``group`` to merge into one (in group order), or none: record batches
    of one schema, each up to ``_MERGE_MAX_BYTES``, together up to ``_JOINT_MAX_BYTES``,
    not retried after the rate limiter; at least two."""
    out: list[_Append] = []
    schema: pa.Schema | None = None
    total = 0
    for t in group:
        r = t.records
        if not isinstance(r, pa.RecordBatch) or t.room or not r.num_rows:
            continue
        # The bytes of the buffers it holds (an upper bound of ``nbytes``, which a slice of a
        # larger batch only references part of): 0.7 us against nbytes' 28 us for a
        # camera-sized batch, on the combiner's serial path. A slice of a large batch is
        # then not merged, only stored alone.
        size = r.get_total_buffer_size()
        if size > _MERGE_MAX_BYTES or total + size > _JOINT_MAX_BYTES:
            continue
        if schema is None:
            schema = r.schema
        elif not (r.schema is schema or r.schema.equals(schema)):
            continue
        out.append(t)
        total += size
    return out if len(out) > 1 else []


def _out_of_space(exc: BaseException | None) -> TypeGuard[OSError]:
    """Whether ``exc`` is the file system out of space (ENOSPC) or over a quota (EDQUOT)."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
