"""Where an append's acknowledgement latency goes, phase by phase (``ReplayBuffer.stats``).

An append that stores records passes four phases between the call and its return:

* ``staging``: waiting for the combiner and being staged by it (validation,
  de-duplication, the rate limiter, including any wait for room, and the claim of rows;
  ``buffer.table.combiner``);
* ``writing``: the IPC encoding, the WAL write and the copy into the hot tail;
* ``durable``: until an fdatasync of its WAL stripe covered its record (group commit: the
  sync of another append may cover it);
* ``visible``: until every earlier row is durable too (the watermark recovery keeps) and it
  was woken.

The sums tell which one an ingest figure is waiting on without instrumenting the code again:
the phases add up to the acknowledgement latency, so a slow disk shows in ``durable``, CPU or
GIL contention in ``staging`` and ``writing``, a slow stripe holding others back in
``visible``. A merged append (``buffer.table.writer``) counts once, timed by the member that writes
it; a pure retry (every record stored before) writes nothing and is not counted.
"""

from __future__ import annotations

import threading

PHASES = ("staging", "writing", "durable", "visible")


class AckPhases:
    """Seconds spent per phase, summed over the appends since the buffer opened (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sums = dict.fromkeys(PHASES, 0.0)
        self.count = 0

    def add(self, start: float, staged: float, written: float, durable: float, end: float) -> None:
        """One append's ``time.perf_counter()`` readings at its start, staged, written, made
        durable by an fdatasync and returned (non-decreasing)."""
        with self._lock:
            s = self._sums
            s["staging"] += staged - start
            s["writing"] += written - staged
            s["durable"] += max(durable - written, 0.0)
            s["visible"] += max(end - max(durable, written), 0.0)
            self.count += 1

    def mean_ms(self) -> dict[str, float]:
        """``{phase: mean milliseconds per append}``, zeros before the first append."""
        with self._lock:
            n = self.count
            return {k: (v / n * 1e3 if n else 0.0) for k, v in self._sums.items()}
