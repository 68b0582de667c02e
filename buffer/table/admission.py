"""Admission of one writer's appends: everything before the write, staged by the combiner
(``buffer.table.combiner``) one append at a time.

An append is validated whole, de-duplicated against the index, admitted by the rate limiter
(an append with no room waits for it in its own thread, outside the combiner) and given rows
under the lock. Small appends waiting together are merged into one (one validation, WAL
record and fdatasync for all of them).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from buffer.columns import StepColumns
from buffer.errors import (
    BackpressureError,
    BufferClosedError,
    RateLimiterTimeout,
    StepValidationError,
)
from buffer.files.wal import WriteAheadLog
from buffer.table.chunks import Chunk
from buffer.table.claim import AppendResult, Claim
from buffer.table.combiner import Combiner, Ticket, one_at_a_time
from buffer.table.write_path import WritePath

# Appends of at most this many bytes that wait for the combiner together are merged into
# one (see ``Admission._stage_group``), up to ``_JOINT_MAX_BYTES`` per merged append: their
# fixed costs (validation, de-duplication, index, WAL record, fdatasync, publish, hand-offs)
# are paid once; a camera-sized batch gains nothing from it and would be copied, so stays
# alone.
_MERGE_MAX_BYTES = 256 * 1024
_JOINT_MAX_BYTES = 2 * 1024 * 1024


class Append(Ticket):
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
        self.claim: Claim | None = None
        self.cols: StepColumns | None = None
        self.joint: Joint | None = None  # the merged append it is part of


class Joint:
    """Several appends merged into one claim (``Admission._stage_group``); the last member
    writes and commits it and then gives every other member its result, or the error."""

    __slots__ = ("claim", "cols", "members")

    def __init__(self, claim: Claim, cols: StepColumns, members: list[Append]) -> None:
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


class Admission:
    """Stages one writer's appends (validate, de-duplicate, rate limiter, rows).

    Args:
        writer: the writer it belongs to (its state, WAL, tail and failure).
    """

    def __init__(self, writer: WritePath) -> None:
        self.writer = writer
        self.state = writer.state
        self.rate_limiter = writer.rate_limiter
        self._combiner: Combiner[Append] = Combiner(self._stage_group)
        self.appends = 0  # appends staged with records (alone or merged)
        self.merged_appends = 0  # of them, staged as part of a merged one (``_stage_group``)

    def admit(self, records: pa.RecordBatch | pa.Table, timeout: float | None) -> Append:
        """Stage an append through the combiner (possibly on another appending thread),
        waiting for room in the rate limiter outside it; the staged ticket: its ``result``
        when it is done already (empty, or a merged append's member), else its ``claim``
        or its ``joint``.

        Raises:
            what staging raises (``ReplayBuffer.append``'s errors).
        """
        ticket = Append(records, timeout)
        while True:
            self._combiner.submit(ticket)
            if ticket.error is not None:
                if ticket.room and self.rate_limiter is not None:
                    # Admitted ahead, then refused before staging counted it: give it back.
                    self.rate_limiter.undo_insert(ticket.room)
                    ticket.room = 0
                raise ticket.error
            if not ticket.needs_room:
                return ticket
            self._await_room(ticket)  # outside the combiner: other appends go on

    def _stage_group(self, group: list[Append], staged: Callable[[Append], None]) -> None:
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

    def _stage_joint(self, members: list[Append], staged: Callable[[Append], None]) -> bool:
        """Stage ``members`` as one append; False, with nothing claimed, when they must be
        staged one at a time instead (any error: each alone names its own)."""
        st = self.state
        try:
            batch, cols = st.schema.validate_columns(
                pa.concat_batches([m.records for m in members])  # type: ignore[misc]
            )
        except Exception:  # noqa: BLE001 - each member staged alone names what was wrong
            return False
        if st.closed or self.writer.failed is not None or self.writer.wal is None:
            return False  # staged alone, each raises (or recovers) as it should
        wal = self._stripe(cols)
        wal.begin()
        claim: Claim | None = None
        try:
            claim = self._deduplicated(batch, cols, wal)
            if not self._admitted_now(claim):
                self.release(claim)
                return False
            self._claim_rows(claim)
        except BaseException as exc:  # nothing claimed: staged alone, each raises it
            if claim is None:
                wal.end()
            else:
                self.release(claim)
            if not isinstance(exc, Exception):
                raise
            return False
        joint = Joint(claim, cols, members)
        for m in members:
            m.joint = joint
        for m in members[:-1]:
            m.parked = True  # woken by the last member once the merged append is stored
        self.appends += len(members)
        self.merged_appends += len(members)
        staged(members[-1])
        return True

    def _admitted_now(self, claim: Claim) -> bool:
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

    def _stage(self, ticket: Append) -> None:
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
        if self.writer.failed is not None:
            self.writer.recover()
        wal = self._stripe(cols)
        wal.begin()
        claim: Claim | None = None
        try:
            claim = self._deduplicated(batch, cols, wal)
            if not self._limit(claim, ticket):
                ticket.needs_room = claim.new.num_rows
                self.release(claim)
                return
            self._claim_rows(claim)
        except BaseException:
            if claim is None:
                wal.end()
            else:
                self.release(claim)
            raise
        ticket.claim, ticket.cols, ticket.needs_room = claim, cols, 0
        self.appends += 1

    def _stripe(self, cols: StepColumns) -> WriteAheadLog:
        """The WAL stripe of a batch, by its first robot (spreads robots over the stripes;
        recovery merges them by row id, so a merged batch of several robots may go to any)."""
        assert self.writer.wal is not None
        logs = self.writer.wal.logs
        return logs[zlib.crc32(cols.robot.names[0].encode()) % len(logs)]

    def release(self, claim: Claim) -> None:
        """What an append holds when it returns or fails: its stripe's announcement, its
        count among claimed appends, inserts the rate limiter counted and not stored."""
        if claim.announced:
            claim.announced = False
            claim.wal.end()
        if claim.counted:
            claim.counted = False
            st = self.state
            with st.lock:
                self.writer.claimed -= 1
                if not self.writer.claimed:  # only a recovery waits for this
                    st.cond.notify_all()
        if claim.limited and self.rate_limiter is not None:
            self.rate_limiter.undo_insert(claim.limited)
            claim.limited = 0

    def _deduplicated(self, batch: pa.RecordBatch, cols: StepColumns, wal: WriteAheadLog) -> Claim:
        """A claim of the records of ``batch`` not stored yet; out-of-order seqs are
        refused."""
        st = self.state
        with st.lock:
            dup, bad = st.index.classify_seqs(cols.robot, cols.seq, st.retired)
            if bad >= 0:
                raise self._out_of_order(cols, bad)
            recoveries = self.writer.recoveries
        if not dup.any():
            return Claim(batch, cols, wal, recoveries=recoveries)
        return Claim(batch.filter(pa.array(~dup)), cols.take(~dup), wal, dup, recoveries)

    def _out_of_order(self, cols: StepColumns, bad: int) -> StepValidationError:
        """The refusal of record ``bad``'s seq: at or below its robot's highest stored seq,
        never stored (locked)."""
        robot, seq = cols.robot.value(bad), int(cols.seq[bad])
        tops = (self.state.index.last_seq(robot), self.state.retired.last(robot))
        last = max((t for t in tops if t is not None), default=None)
        return StepValidationError(
            f"record {bad} (robot_id={robot!r}, seq={seq}): field "
            f"'seq' is out of order (robot's highest stored seq is {last}, and this "
            "seq was never stored)",
            record=bad,
            field="seq",
            robot_id=robot,
            seq=seq,
        )

    def _limit(self, claim: Claim, ticket: Append) -> bool:
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
            return False  # the caller gives back ``claim.limited`` (:meth:`release`)
        claim.limited = n_new
        return True

    def _await_room(self, ticket: Append) -> None:
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

    def _claim_rows(self, claim: Claim) -> None:
        """Give the new records their rows and the tail they go into (see
        :meth:`_claim_locked`); when the tail is full, this append rotates the WAL first,
        outside the lock (see :meth:`Writer.rotate`), and tries again."""
        while True:
            rotation = self._claim_locked(claim)
            if rotation is None:
                return
            self.writer.rotate(*rotation)

    def _claim_locked(self, claim: Claim) -> tuple[Chunk, int] | None:
        """Under the lock: claim rows (no other append was staged since
        :meth:`_deduplicated`: the combiner stages one at a time). Returns None once claimed,
        or the full tail and the first row of the next one when this append must rotate."""
        st = self.state
        with st.lock:
            if st.closed:
                raise BufferClosedError(f"{st.directory}: buffer closed")
            if self.writer.failed is not None:
                raise self.writer.refusal()
            claim.first = claim.end = st.index.end
            if claim.new.num_rows:
                tail = self.writer.tail_for(claim.new.num_rows)
                if tail is None:
                    assert self.writer.tail is not None
                    self.writer.rotating = True
                    return self.writer.tail, st.index.end
                claim.tail = tail
                claim.first, claim.end = st.index_rows(claim.cols)
                self.writer.unwritten += 1
                self.writer.claimed += 1
                claim.counted = True
            return None


def _mergeable(group: list[Append]) -> list[Append]:
    """The appends of ``group`` to merge into one (in group order), or none: record batches
    of one schema, each up to ``_MERGE_MAX_BYTES``, together up to ``_JOINT_MAX_BYTES``,
    not retried after the rate limiter; at least two."""
    out: list[Append] = []
    schema: pa.Schema | None = None
    total = 0
    for t in group:
        r = t.records
        if not isinstance(r, pa.RecordBatch) or t.room or not r.num_rows:
            continue
        # The bytes of the buffers it holds (an upper bound of ``nbytes``, which a slice of a
        # larger batch only references part of): far cheaper than ``nbytes`` for a
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
