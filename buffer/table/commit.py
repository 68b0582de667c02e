"""Group commit of one writer: an append's record into its WAL stripe and the open tail,
then one fdatasync shared by the appends that wait on the same stripe.

The thread that runs a stripe's fdatasync (the leader) hands every record its sync covered
to the watermark (``buffer.table.watermark``) and passes the lead to the earliest append it
did not cover.
"""

from __future__ import annotations

import threading
import time

from buffer.columns import StepColumns
from buffer.files.encoding import ipc_message, ipc_pieces, pieces_size
from buffer.files.wal import WriteAheadLog
from buffer.table.chunks import ColdArrays
from buffer.table.claim import Claim
from buffer.table.tail_reads import WalTailReader
from buffer.table.watermark import Watermark
from buffer.table.write_path import WritePath


class GroupCommit:
    """Writes and fdatasyncs of one writer's appends.

    Args:
        writer: the writer it belongs to (its state, WAL and failure).
        watermark: the writer's watermark (publishes what a sync covered).
    """

    def __init__(self, writer: WritePath, watermark: Watermark) -> None:
        self.writer = writer
        self.state = writer.state
        self.watermark = watermark
        self.unsynced: list[list[_Unsynced]] = []  # per stripe: written, not known durable

    def start(self) -> None:
        """One list of unsynced appends per stripe of the writer's fresh WAL."""
        assert self.writer.wal is not None
        self.unsynced = [[] for _ in self.writer.wal.logs]

    def write(self, claim: Claim) -> int:
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
                self.writer.unwritten -= 1
                self.writer.fail(exc)
            self.writer.raise_disk_full(exc)
            raise
        with st.lock:
            self.writer.unwritten -= 1
            if not self.writer.unwritten:  # a rotation, a recovery or close waits for this
                st.cond.notify_all()
        return lsn

    def _sync(self, wal: WriteAheadLog, lsn: int) -> None:
        """fdatasync the stripe up to ``lsn`` (group commit: shared with other appends)."""
        try:
            wal.sync(lsn)
        except BaseException as exc:
            with self.state.lock:
                self.writer.fail(exc)
            self.writer.raise_disk_full(exc)
            raise

    def commit(self, claim: Claim, cols: StepColumns, lsn: int) -> tuple[dict[str, int], float]:
        """Wait until this append's rows (written to its stripe up to ``lsn``) are durable
        and every row before them is too (recovery keeps the contiguous prefix of the
        stripes), then acknowledge: ``(acked, when an fdatasync covered its rows)``
        (``time.perf_counter``).

        Group commit with one wake-up per append: the thread that runs a stripe's fdatasync
        (the leader, :meth:`WriteAheadLog.sync`) publishes every record its sync covered
        (:meth:`synced`) and wakes each append its publish made visible; an append that
        found a leader at work waits on its own event, and when that leader's sync did not
        cover it, the leader hands the lead to the earliest such append.

        Raises:
            DiskFullError / OSError: the fdatasync, or one this append's rows wait behind,
                failed (the rows are not acknowledged).
        """
        st, wal = self.state, claim.wal
        me = _Unsynced(lsn, claim.first, claim.end, threading.Event())
        with st.lock:
            self.watermark.visibility.add(claim.end, me.woken)
            if wal.synced >= lsn:  # a sync that started after this write covered it
                me.durable_at = time.perf_counter()
                self.watermark.durable[claim.first] = claim.end
                self.watermark.advance()
                lead = False
            else:
                self.unsynced[wal.stripe].append(me)
                lead = not wal.syncing  # else that leader publishes or hands the lead on
        while True:
            if lead:
                self._sync(wal, lsn)
                with st.lock:
                    self.synced(wal)
            elif not me.woken.wait(0.5):
                me.lead = True  # no wake-up can be lost for good: sync and publish itself
            with st.lock:
                me.woken.clear()
                if st.visible >= claim.end:
                    return self.watermark.acked(cols), me.durable_at
                if self.writer.failed is not None:
                    raise self.writer.refusal()
                lead, me.lead = me.lead, False

    def synced(self, wal: WriteAheadLog) -> None:
        """Publish the appends of stripe ``wal`` its last fdatasync covered, and hand the
        lead to the earliest one still unsynced when no sync is under way (locked)."""
        unsynced = self.unsynced[wal.stripe]
        if not unsynced:
            return
        synced = wal.synced
        covered = [u for u in unsynced if u.lsn <= synced]
        if covered:
            now = time.perf_counter()
            for u in covered:
                u.durable_at = now
                self.watermark.durable[u.first] = u.end
            unsynced[:] = [u for u in unsynced if u.lsn > synced]
            self.watermark.advance()
        if unsynced and not wal.syncing:
            nxt = min(unsynced, key=lambda u: u.lsn)
            nxt.lead = True
            nxt.woken.set()

    def synced_all(self) -> None:
        """:meth:`synced` of every stripe (after a rotation or close synced them; locked)."""
        if self.writer.wal is not None:
            for w in self.writer.wal.logs:
                self.synced(w)


class _Unsynced:
    """An append written to its stripe up to ``lsn`` and not yet known durable."""

    __slots__ = ("lsn", "first", "end", "woken", "lead", "durable_at")

    def __init__(self, lsn: int, first: int, end: int, woken: threading.Event) -> None:
        self.lsn, self.first, self.end, self.woken = lsn, first, end, woken
        self.lead = False  # set with ``woken``: this append runs the stripe's next sync
        self.durable_at = 0.0  # perf_counter when a sync covered it (``ack_phases``)
