"""Where uploaded steps go: the :class:`StepSink` seam between transport and buffer.

The cloud server hands each complete, validated step batch of one robot to a sink and
acknowledges to the robot the highest ``seq`` the sink reports durable (fsynced). The sink owns
de-duplication and order: it stores the rows it does not hold and refuses, naming the seq, a row
at or below the robot's highest stored seq that it never stored (so an acknowledgement only ever
covers rows the sink holds). A sink that cannot take more right now raises
:class:`Backpressure`; the robot keeps the batch in its spool and resends after
``retry_after_s``.
An operator's episode mark (discard, rerecord) goes to the same sink: the episode's steps are
never to be trained on.
"""

from __future__ import annotations

import threading
from array import array
from bisect import bisect_left
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from comms.wire import steps
from comms.wire.steps import NO_SEQ


class Backpressure(RuntimeError):
    """The sink refuses the batch for now (rate limiter or disk); nothing of it was stored."""

    def __init__(self, reason: str, retry_after_s: float = 0.5) -> None:
        super().__init__(reason)
        self.retry_after_s = retry_after_s


class SinkFull(RuntimeError):
    """The sink has no room on its disk; nothing of the batch was stored. The robot keeps it
    and retries later: the sink takes batches again by itself once space is back."""


class SinkClosed(RuntimeError):
    """The sink was closed (its run stopped, or the cloud is shutting down); nothing of the batch
    was stored. The robot keeps it and resends once the run takes steps again."""


class SinkRejected(ValueError):
    """The sink found the batch invalid (its schema, values or seq order); nothing was stored."""


@runtime_checkable
class StepSink(Protocol):
    """Durable destination of one run's steps."""

    def append(self, robot_id: int, batch: pa.RecordBatch) -> int:
        """Store the rows of ``batch`` (all of ``robot_id``, ``seq`` increasing) not stored yet.

        A row whose seq the sink holds is a duplicate (a resend): not stored again. A robot's
        seqs are stored in increasing order, so a row at or below its highest stored seq that
        the sink never stored can never be: the batch is refused naming that seq.

        Returns:
            The highest ``seq`` of ``robot_id`` that is durable (fsynced) after this call.

        Raises:
            Backpressure: nothing was stored; retry later.
            SinkFull: its disk is full; nothing was stored; retry later.
            SinkClosed: the sink was closed; nothing was stored; retry later.
            SinkRejected: the batch is invalid or a seq is out of order; nothing was stored.
        """
        ...

    def durable_seq(self, robot_id: int) -> int:
        """Highest durable ``seq`` of ``robot_id``, or -1 when there is none."""
        ...

    def mark_episode(
        self, robot_id: int, run_id: str, episode_index: int, kind: str, reason: str = ""
    ) -> int:
        """Store durably that episode ``episode_index`` of ``robot_id`` in ``run_id`` is never
        to be trained on (``kind``: ``discard`` or ``rerecord``), or how it ended (``success``
        or ``failure``: nothing excluded), its steps stored before or after this call.
        Marking an episode the same way again changes nothing. ``reason``: who gave the mark
        (the operator's class name, ``classifier``, ``driver``, ``cloud: <actor>``), kept.

        Returns:
            How many of the episode's steps the mark excludes (an outcome: labels) so far.

        Raises:
            SinkRejected: an unknown ``kind`` or an invalid episode; nothing was stored.
            SinkFull: its disk is full; nothing was stored; retry later.
            SinkClosed: the sink was closed; nothing was stored; retry later.
        """
        ...


# run_id -> its sink, or None when the cloud does not know the run.
SinkResolver = Callable[[str], StepSink | None]


class MemorySink:
    """In-memory stand-in for tests and benchmarks: "durable" as soon as appended.

    Args:
        capacity_rows: when set, raises :class:`Backpressure` once this many rows are held
            (until :meth:`drain` is called), to exercise the backpressure path.
        keep_rows: False keeps each robot's stored seqs only (8 bytes a row) and drops the
            rows, as a transport benchmark's sink: what it measures is then the transport,
            not RAM filling with the uploaded bytes (``batches`` stays empty).
    """

    def __init__(self, capacity_rows: int | None = None, *, keep_rows: bool = True) -> None:
        self._lock = threading.Lock()
        self.batches: list[tuple[int, pa.RecordBatch]] = []
        self._stored: dict[int, array[int]] = {}  # robot -> its stored seqs, ascending
        self._rows = 0
        self.capacity_rows = capacity_rows
        self.bytes = 0
        self.marks: dict[tuple[int, str, int], str] = {}  # (robot, run, episode) -> kind
        self.outcomes: dict[tuple[int, str, int], str] = {}  # the same key -> its latest outcome
        self.keep_rows = keep_rows

    def append(self, robot_id: int, batch: pa.RecordBatch) -> int:
        with self._lock:
            have = self._stored.setdefault(robot_id, array("q"))
            seqs = steps.seq_numpy(batch)
            old = _known_prefix(robot_id, have, seqs)
            new = batch.slice(old)
            if self.capacity_rows is not None and self._rows + new.num_rows > self.capacity_rows:
                raise Backpressure(f"memory sink full ({self._rows} rows)", retry_after_s=0.05)
            if new.num_rows:
                if self.keep_rows:
                    self.batches.append((robot_id, new))
                self._rows += new.num_rows
                self.bytes += new.nbytes
                have.frombytes(seqs[old:].astype(np.int64, copy=False).tobytes())
            return have[-1] if have else NO_SEQ

    def durable_seq(self, robot_id: int) -> int:
        with self._lock:
            have = self._stored.get(robot_id)
            return have[-1] if have else NO_SEQ

    def mark_episode(
        self, robot_id: int, run_id: str, episode_index: int, kind: str, reason: str = ""
    ) -> int:
        if kind not in ("discard", "rerecord", "success", "failure"):
            raise SinkRejected(f"unknown episode mark {kind!r}")
        with self._lock:
            key = (robot_id, run_id, episode_index)
            if kind in ("success", "failure"):
                self.outcomes[key] = kind
            else:
                self.marks.setdefault(key, kind)
            return sum(
                int(pc.sum(pc.equal(b.column("episode_index"), episode_index)).as_py() or 0)
                for rid, b in self.batches
                if rid == robot_id and "episode_index" in b.schema.names
            )

    def drain(self) -> None:
        """Forget the row count used for backpressure (as if the learner consumed it)."""
        with self._lock:
            self._rows = 0

    def seqs(self, robot_id: int) -> list[int]:
        """Every stored ``seq`` of ``robot_id``, in arrival order."""
        with self._lock:
            out: list[int] = []
            for rid, b in self.batches:
                if rid == robot_id:
                    out.extend(b.column("seq").to_pylist())
            return out


def _known_prefix(robot_id: int, have: array[int], seqs: np.ndarray) -> int:
    """How many leading ``seqs`` (increasing) are at or below the highest of ``have`` (the
    robot's stored seqs, ascending); each of them must be stored already.

    Raises:
        SinkRejected: one of them was never stored (it is out of order).
    """
    last = have[-1] if have else NO_SEQ
    if not len(seqs) or int(seqs[0]) > last:
        return 0  # the usual case: all new
    n = 0
    for s in seqs.tolist():
        if s > last:
            break
        i = bisect_left(have, s)
        if i == len(have) or have[i] != s:
            raise SinkRejected(
                f"seq {s} of robot {robot_id} is out of order: its highest stored seq is "
                f"{last} and this seq was never stored"
            )
        n += 1
    return n
