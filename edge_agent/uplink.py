"""Steps from the control loop -> durable spool (with per-robot seq), on a background thread.

The control loop only calls :meth:`UplinkWorker.submit` (a queue put; never blocks on disk or
network). The writer thread makes each step durable at once in the open batch's journal
(:class:`~edge_agent.journal.StepJournal`: one fdatasync for the step, or for the few queued
together), groups steps into batches (``batch_max_steps`` or ``batch_max_delay_s``),
validates them against the buffer's :class:`buffer.table.schema.StepSchema`, stamps each row with
the next ``seq`` and makes the batch durable in the :class:`~edge_agent.spool.Spool`. An agent
killed at any moment thus loses only the steps it had not submitted yet (the row the recorder
holds for its successor, the step in flight) and one being appended; a restarted uplink
spools the journal's steps first. Sending is comms' job:
:class:`comms.robot.uploader.Uploader` streams the spool (it satisfies ``comms.robot.uploader.Spool``),
resumes from the cloud's durable seq after any reconnect (no gaps, no duplicates) and acks
delete batches from the spool.

``robot_id`` travels as the schema's type, or as int64 when ``robot_id_on_wire="int64"``:
comms identifies a robot by its integer metadata id while the buffer schema declares a string,
so the cloud side converts.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa

from edge_agent.journal import StepJournal
from edge_agent.spool import Spool

log = logging.getLogger(__name__)

_FLUSH = object()


@dataclass
class UplinkStats:
    """Counters reported in heartbeats (steps unless named otherwise)."""

    submitted: int = 0
    spooled: int = 0
    invalid: int = 0


class UplinkWorker:
    """Spools one robot's steps.

    Args:
        spool: the robot's durable spool (owns ``seq``).
        schema: the buffer's ``StepSchema``; records are built and validated with it.
        batch_max_steps / batch_max_delay_s: when a batch is cut.
        robot_id_on_wire: ``"schema"`` keeps the schema's robot_id type; ``"int64"`` sends the
            integer robot id comms checks against the caller's credential.
    """

    def __init__(
        self,
        spool: Spool,
        schema: Any,
        *,
        batch_max_steps: int = 20,
        batch_max_delay_s: float = 0.5,
        robot_id_on_wire: Literal["schema", "int64"] = "schema",
    ) -> None:
        self.spool = spool
        self.schema = schema
        self.batch_max_steps = batch_max_steps
        self.batch_max_delay_s = batch_max_delay_s
        self.robot_id_on_wire = robot_id_on_wire
        self.stats = UplinkStats()
        self._q: queue.Queue[Any] = queue.Queue()
        self._flushed = threading.Condition()
        self._pending_flushes = 0
        self._done_flush = 0
        self.journal = StepJournal(spool.directory)
        self._writer = threading.Thread(target=self._write_loop, name="edge-spool", daemon=True)
        # pyarrow imports pandas on its first conversion of a Python list: 1.5 s of CPU on an
        # idle machine, ~7 s for each of 8 robot processes sharing 2 loaded cores (measured by
        # profiling bench efficiency --scaling), during which no step reached the cloud. Pay it
        # here, while the agent is built, not in the first batch of a run.
        pa.array([0], type=pa.int64())

    def start(self) -> UplinkWorker:
        """Spool the steps a crash left in the journal, then start the writer thread."""
        first, records = self.journal.read()
        if records and first >= self.spool.next_seq:  # else that batch reached the spool
            self._write(records)
        self.journal.clear()
        self._writer.start()
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
        return self.spool.wait_acked(self.spool.next_seq - 1, max(0.0, end - time.monotonic()))

    def close(self, timeout: float = 5.0) -> None:
        """Spool what is queued and stop the writer. Unsent batches stay in the spool."""
        self._q.put(None)
        if self._writer.is_alive():
            self._writer.join(timeout)
        if not self._writer.is_alive():
            self.journal.close()

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
            records, item = self._gather(item, self.batch_max_steps - len(pending))
            if records:
                self.journal.append(records, self.spool.next_seq)
                if not pending:
                    oldest = time.monotonic()
                pending += records
            flush_target = None
            if isinstance(item, tuple) and item and item[0] is _FLUSH:
                flush_target = item[1]
            due = pending and (
                len(pending) >= self.batch_max_steps
                or flush_target is not None
                or item is None
                or time.monotonic() - oldest >= self.batch_max_delay_s
            )
            if due:
                self._write(pending)
                self.journal.clear()
                pending = []
            if item is None:
                return
            if flush_target is not None:
                with self._flushed:
                    self._done_flush = max(self._done_flush, flush_target)
                    self._flushed.notify_all()

    def _gather(self, item: Any, room: int) -> tuple[list[Mapping[str, Any]], Any]:
        """``item`` and the step records queued right behind it, at most ``room`` (they are
        made durable together); returns them and the next item that is no record (a flush,
        the stop, or ``()`` for none)."""
        records: list[Mapping[str, Any]] = []
        while isinstance(item, Mapping):
            records.append(item)
            if len(records) >= room:
                return records, ()
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                return records, ()
        return records, item

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
            if self.robot_id_on_wire == "int64":
                i = batch.schema.get_field_index("robot_id")
                batch = batch.set_column(i, "robot_id", batch.column(i).cast(pa.int64()))
            entry = self.spool.write(batch)
        if entry is not None:
            self.stats.spooled += batch.num_rows

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


def step_batch_bytes(batch: pa.RecordBatch) -> bytes:
    """One Arrow IPC stream holding ``batch`` (what travels in ``StepBatch.arrow_ipc``)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    return sink.getvalue().to_pybytes()
