"""Where uploaded steps go: the :class:`StepSink` seam between transport and buffer.

The cloud server hands each complete, validated step batch of one robot to a sink and
acknowledges to the robot the highest ``seq`` the sink reports durable (fsynced). A sink that
cannot take more right now raises :class:`Backpressure`; the robot keeps the batch in its spool
and resends after ``retry_after_s``. An operator's episode mark (discard, rerecord) goes to the
same sink: the episode's steps are never to be trained on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import pyarrow as pa
import pyarrow.compute as pc

NO_SEQ = -1


class Backpressure(RuntimeError):
    """The sink refuses the batch for now (rate limiter or disk); nothing of it was stored."""

    def __init__(self, reason: str, retry_after_s: float = 0.5) -> None:
        super().__init__(reason)
        self.retry_after_s = retry_after_s


class SinkRejected(ValueError):
    """The sink found the batch invalid (its schema, values or seq order); nothing was stored."""


@runtime_checkable
class StepSink(Protocol):
    """Durable destination of one run's steps."""

    def append(self, robot_id: int, batch: pa.RecordBatch) -> int:
        """Store ``batch`` (all rows of ``robot_id``, ``seq`` increasing, none already durable).

        Returns:
            The highest ``seq`` of ``robot_id`` that is durable (fsynced) after this call.

        Raises:
            Backpressure: nothing was stored; retry later.
            SinkRejected: the batch is invalid; nothing was stored.
        """
        ...

    def durable_seq(self, robot_id: int) -> int:
        """Highest durable ``seq`` of ``robot_id``, or -1 when there is none."""
        ...

    def mark_episode(self, robot_id: int, run_id: str, episode_index: int, kind: str) -> int:
        """Store durably that episode ``episode_index`` of ``robot_id`` in ``run_id`` is never
        to be trained on (``kind``: ``discard`` or ``rerecord``), its steps stored before or
        after this call. Marking an episode again changes nothing.

        Returns:
            How many of the episode's steps the mark excludes so far.

        Raises:
            SinkRejected: an unknown ``kind`` or an invalid episode; nothing was stored.
        """
        ...


# run_id -> its sink, or None when the cloud does not know the run.
SinkResolver = Callable[[str], StepSink | None]


class MemorySink:
    """In-memory stand-in for tests and benchmarks: "durable" as soon as appended.

    Args:
        capacity_rows: when set, raises :class:`Backpressure` once this many rows are held
            (until :meth:`drain` is called), to exercise the backpressure path.
    """

    def __init__(self, capacity_rows: int | None = None) -> None:
        self._lock = threading.Lock()
        self.batches: list[tuple[int, pa.RecordBatch]] = []
        self._durable: dict[int, int] = {}
        self._rows = 0
        self.capacity_rows = capacity_rows
        self.bytes = 0
        self.marks: dict[tuple[int, str, int], str] = {}  # (robot, run, episode) -> kind

    def append(self, robot_id: int, batch: pa.RecordBatch) -> int:
        with self._lock:
            if self.capacity_rows is not None and self._rows + batch.num_rows > self.capacity_rows:
                raise Backpressure(f"memory sink full ({self._rows} rows)", retry_after_s=0.05)
            self.batches.append((robot_id, batch))
            self._rows += batch.num_rows
            self.bytes += batch.nbytes
            last = int(batch.column("seq")[-1].as_py()) if batch.num_rows else NO_SEQ
            self._durable[robot_id] = max(self._durable.get(robot_id, NO_SEQ), last)
            return self._durable[robot_id]

    def durable_seq(self, robot_id: int) -> int:
        with self._lock:
            return self._durable.get(robot_id, NO_SEQ)

    def mark_episode(self, robot_id: int, run_id: str, episode_index: int, kind: str) -> int:
        if kind not in ("discard", "rerecord"):
            raise SinkRejected(f"unknown episode mark {kind!r}")
        with self._lock:
            self.marks.setdefault((robot_id, run_id, episode_index), kind)
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
