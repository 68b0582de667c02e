"""The acknowledgement watermark of one writer: every row below it is fdatasynced.

Appends become durable out of order (stripes sync independently); the watermark moves over
the contiguous synced ones, publishes their rows (visible to readers, counted in the index)
and wakes each append its move made visible. Recovery keeps the contiguous prefix of the WAL
stripes, so every row an acknowledgement covers survives a crash.
"""

from __future__ import annotations

import heapq
import threading

from buffer.columns import StepColumns
from buffer.table.claim import Claim
from buffer.table.write_path import WritePath


class Watermark:
    """The durable watermark, the visible rows it publishes and the acknowledgements.

    Args:
        writer: the writer it belongs to (its state, tail, sealer and failure).
    """

    def __init__(self, writer: WritePath) -> None:
        self.writer = writer
        self.state = writer.state
        self.mark = 0  # every row below it is durable
        self.durable: dict[int, int] = {}  # synced appends above the watermark: first -> end
        self.visibility = _Wakeups()  # appends waiting for their rows to become visible

    def acknowledge(self, claim: Claim, cols: StepColumns) -> dict[str, int]:
        """Acknowledge an append whose records were all stored before (a pure retry) once
        the rows it duplicates (all below ``claim.end``) are visible."""
        st = self.state
        while True:
            with st.lock:
                if self.writer.recoveries != claim.recoveries:
                    # The rows it duplicates may be among those the recovery dropped (never
                    # acknowledged), and later rows may have taken their place: refuse it;
                    # a retry stores what is missing.
                    raise self.writer.dropped_meanwhile()
                if st.visible >= claim.end:
                    return self.acked(cols)
                if self.writer.failed is not None:
                    raise self.writer.refusal()
                # Its own wake-up, not the shared condition: a publish wakes only the
                # appends it made visible (many writers on one condition would cost a
                # context switch each per publish).
                woken = self.visibility.expect(claim.end)
            woken.wait(0.5)

    def advance(self) -> None:
        """Move the durable watermark over contiguous synced appends and publish (locked)."""
        start = self.mark
        while self.mark in self.durable:
            self.mark = self.durable.pop(self.mark)
        if self.mark > start:
            self._publish(start, self.mark)
            self.visibility.wake_upto(self.state.visible)
            self.writer.sealer.rows_visible()
            self.state.cond.notify_all()  # close waits for visibility (rarely anyone else)

    def _publish(self, first: int, end: int) -> None:
        # Called with the durable watermark only: every row below ``end`` is on disk.
        st = self.state
        if end <= st.visible:
            return
        start = min(first, st.visible)
        tail = self.writer.tail
        if tail is not None and tail.first_row <= end <= tail.first_row + tail.capacity:
            tail.n = max(tail.n, end - tail.first_row)
        st.transitions_inserted += st.index.publish(start, end)
        st.visible = end

    def acked(self, cols: StepColumns) -> dict[str, int]:
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
