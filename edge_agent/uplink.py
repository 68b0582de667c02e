"""Steps from the control loop -> durable spool (with seq) -> cloud, in two background threads.

The control loop only calls :meth:`UplinkWorker.submit` (a queue put; never blocks on disk or
network). The *writer* thread groups steps into batches (``batch_max_steps`` or
``batch_max_delay_s``), stamps each with the next per-robot ``seq``, validates it against the
buffer's :class:`buffer.schema.StepSchema` and makes it durable in the :class:`Spool`.
The *sender* thread keeps an upload session open, streams spooled batches in seq order with up
to ``window`` in flight, and deletes them once the cloud's ack says they are fsynced there.

No gaps, no duplicates: a session opens with the cloud's ``durable_seq``; everything at or
below it is deleted from the spool, everything above it is sent, once per session, in order.
A lost connection closes the session; the next one starts again from the cloud's
``durable_seq``, so a batch that was stored but not acknowledged is not sent twice, and one
that was not stored is sent again.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from edge_agent.core import Ack, Uplink, UplinkSession, UplinkUnavailable
from edge_agent.spool import Spool

log = logging.getLogger(__name__)

_FLUSH = object()


@dataclass
class UplinkStats:
    """Counters reported in heartbeats (steps unless named otherwise)."""

    submitted: int = 0
    spooled: int = 0
    invalid: int = 0
    sent_batches: int = 0
    acked_seq: int = -1
    sessions: int = 0
    connected: bool = False
    last_error: str = ""


class UplinkWorker:
    """Owns the spool and the upload session of one robot.

    Args:
        spool: the robot's durable spool (owns ``seq``).
        transport: opens upload sessions (gRPC in production); None = spool only (offline).
        schema: the buffer's ``StepSchema``; records are built and validated with it.
        batch_max_steps / batch_max_delay_s: when a batch is cut.
        window: batches in flight before waiting for an ack.
        reconnect_backoff_s: first reconnect delay (doubles up to 5 s).
    """

    def __init__(
        self,
        spool: Spool,
        transport: Uplink | None,
        schema: Any,
        *,
        batch_max_steps: int = 20,
        batch_max_delay_s: float = 0.5,
        window: int = 8,
        reconnect_backoff_s: float = 0.2,
    ) -> None:
        self.spool = spool
        self.transport = transport
        self.schema = schema
        self.batch_max_steps = batch_max_steps
        self.batch_max_delay_s = batch_max_delay_s
        self.window = window
        self.reconnect_backoff_s = reconnect_backoff_s
        self.stats = UplinkStats(acked_seq=spool.acked_seq)
        self._q: queue.Queue[Any] = queue.Queue()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._flushed = threading.Condition()
        self._pending_flushes = 0
        self._done_flush = 0
        self._writer = threading.Thread(target=self._write_loop, name="edge-spool", daemon=True)
        self._sender = threading.Thread(target=self._send_loop, name="edge-uplink", daemon=True)
        self._session: UplinkSession | None = None

    def start(self) -> UplinkWorker:
        self._writer.start()
        if self.transport is not None:
            self._sender.start()
        return self

    # -- control-loop side ---------------------------------------------------------------------

    def submit(self, record: Mapping[str, Any]) -> None:
        """Queue one step record (every schema column except ``seq``). Never blocks."""
        self.stats.submitted += 1
        self._q.put(record)

    def flush(self, timeout: float = 10.0) -> bool:
        """Spool every step submitted so far (durable on return). Returns False on timeout."""
        with self._flushed:
            self._pending_flushes += 1
            target = self._pending_flushes
        self._q.put((_FLUSH, target))
        deadline = time.monotonic() + timeout
        with self._flushed:
            return self._flushed.wait_for(
                lambda: self._done_flush >= target, max(0.0, deadline - time.monotonic())
            )

    _done_flush = 0

    def wait_acked(self, timeout: float) -> bool:
        """Flush, then wait until the cloud acknowledged every spooled step."""
        end = time.monotonic() + timeout
        if not self.flush(timeout):
            return False
        while time.monotonic() < end:
            if self.spool.acked_seq >= self.spool.next_seq - 1:
                return True
            time.sleep(0.01)
        return False

    def close(self, timeout: float = 5.0) -> None:
        """Spool what is queued, stop both threads. Unsent batches stay in the spool."""
        if self._writer.is_alive():
            self.flush(timeout)
        self._stop.set()
        self._wake.set()
        self._q.put(None)
        for t in (self._writer, self._sender):
            if t.is_alive():
                t.join(timeout)
        if self._session is not None:
            self._session.close()

    # -- writer thread ---------------------------------------------------------------------

    def _write_loop(self) -> None:
        pending: list[Mapping[str, Any]] = []
        oldest = 0.0
        while True:
            timeout = (
                None
                if not pending
                else max(0.0, oldest + self.batch_max_delay_s - time.monotonic())
            )
            try:
                item = self._q.get(timeout=timeout)
            except queue.Empty:
                item = ()
            if item is None:
                self._write(pending)
                return
            flush_target = None
            if isinstance(item, tuple) and item and item[0] is _FLUSH:
                flush_target = item[1]
            elif isinstance(item, Mapping):
                if not pending:
                    oldest = time.monotonic()
                pending.append(item)
            due = pending and (
                len(pending) >= self.batch_max_steps
                or flush_target is not None
                or time.monotonic() - oldest >= self.batch_max_delay_s
            )
            if due:
                self._write(pending)
                pending = []
            if flush_target is not None:
                with self._flushed:
                    self._done_flush = max(self._done_flush, flush_target)
                    self._flushed.notify_all()

    def _write(self, records: Sequence[Mapping[str, Any]]) -> None:
        if not records:
            return
        with self.spool.lock:
            first = self.spool.next_seq
            try:
                batch = self._build(records, first)
            except ValueError:
                good = self._filter(records)
                if not good:
                    return
                batch = self._build(good, first)
            self.spool.reserve(batch.num_rows)
            entry = self.spool.write(batch)
        if entry is not None:
            self.stats.spooled += batch.num_rows
        self._wake.set()

    def _build(self, records: Sequence[Mapping[str, Any]], first: int) -> pa.RecordBatch:
        stamped = [{**r, "seq": first + i} for i, r in enumerate(records)]
        return self.schema.validate(self.schema.batch_from_records(stamped))

    def _filter(self, records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """Records the buffer will accept; a bad one is logged and counted, never sent."""
        good = []
        for r in records:
            try:
                self._build([r], 0)
                good.append(r)
            except ValueError as exc:
                self.stats.invalid += 1
                log.error(
                    "dropping invalid step (episode %s frame %s): %s",
                    r.get("episode_index"),
                    r.get("frame_index"),
                    exc,
                )
        return good

    # -- sender thread ---------------------------------------------------------------------

    def _send_loop(self) -> None:
        assert self.transport is not None
        backoff = self.reconnect_backoff_s
        while not self._stop.is_set():
            try:
                session = self.transport.open()
            except UplinkUnavailable as exc:
                self.stats.last_error = str(exc)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            self._session = session
            self.stats.sessions += 1
            self.stats.connected = True
            try:
                self._run_session(session)
                backoff = self.reconnect_backoff_s
            except (UplinkUnavailable, OSError) as exc:
                self.stats.last_error = str(exc)
                log.info("upload session ended: %s", exc)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            finally:
                self.stats.connected = False
                session.close()
                self._session = None

    def _on_ack(self, durable_seq: int) -> None:
        if durable_seq > self.spool.acked_seq:
            self.spool.ack(durable_seq)
        self.stats.acked_seq = self.spool.acked_seq

    def _run_session(self, session: UplinkSession) -> None:
        durable = session.durable_seq
        self._on_ack(durable)
        self.spool.advance_to(durable + 1)
        sent_upto = max(durable, self.spool.acked_seq)
        inflight: list[int] = []
        while not self._stop.is_set():
            for entry in self.spool.pending(after_seq=sent_upto):
                if len(inflight) >= self.window:
                    break
                batch = self.spool.read(entry)
                if batch is None:  # dropped by the full policy after we listed it
                    continue
                if entry.first <= sent_upto:  # only the unsent tail (never a duplicate)
                    batch = batch.slice(sent_upto - entry.first + 1)
                session.send(batch, entry.last)
                self.stats.sent_batches += 1
                inflight.append(entry.last)
                sent_upto = entry.last
            ack: Ack | None = session.next_ack(0.05 if inflight else 0.0)
            if ack is None:
                if not inflight:
                    self._wake.wait(0.05)
                    self._wake.clear()
                continue
            if ack.backpressure:
                # The cloud refused a batch: reopen later and resume from what it really holds.
                self._on_ack(ack.durable_seq)
                self._stop.wait(max(ack.retry_after_s, 0.01))
                raise UplinkUnavailable(f"backpressure: {ack.reason or 'cloud busy'}")
            self._on_ack(ack.durable_seq)
            inflight = [s for s in inflight if s > ack.durable_seq]


def step_batch_bytes(batch: pa.RecordBatch) -> bytes:
    """One Arrow IPC stream holding ``batch`` (what travels in ``StepBatch.arrow_ipc``)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    return sink.getvalue().to_pybytes()
