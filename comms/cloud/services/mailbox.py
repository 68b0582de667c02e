"""One upload stream's step batches, taken in arrival order on worker threads.

Data-plane batches arrive on the data-plane thread; storing them (Arrow parsing, validation,
the sink's fsync) must not run there (one robot's fsync would stall every robot's frames) nor
on the event loop. Passing each frame through the event loop to a worker and back would cost
three thread hand-offs per batch and leave the sink idle while the loop waits for the worker;
with batches of a few hundred KB the hops, not the work, bound the upload. A mailbox instead
queues batches where they arrive and keeps at most one worker draining it: batches that
arrive while it works are taken in its next round (one sink call sequence, one group of acks,
so a slow fsync makes bigger groups, not a longer queue), and only the results cross to the
event loop, once a round.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

# take(batches) -> result, called with every batch queued since the last round, oldest first.
Take = Callable[[list[Any]], Any]


class Mailbox:
    """A FIFO of batches drained by at most one task of ``executor`` at a time.

    Args:
        take: stores a round's batches; returns the round's result. Runs on a worker thread,
            never two rounds at once. An exception it raises is delivered as the result and
            closes the mailbox.
        deliver: called with each round's result in round order, on the worker thread that
            ran it (e.g. ``loop.call_soon_threadsafe`` onto the stream's event loop). A
            ``deliver`` that raises closes the mailbox.
        executor: the threads rounds run on (shared by every stream of a server).
        max_pending: a :meth:`put` that would queue more batches than this is refused.
    """

    def __init__(
        self,
        take: Take,
        deliver: Callable[[Any], object],
        executor: Executor,
        max_pending: int,
    ) -> None:
        self._take = take
        self._deliver = deliver
        self._executor = executor
        self._max_pending = max_pending
        self._lock = threading.Lock()
        self._items: collections.deque[Any] = collections.deque()
        self._draining = False
        self._closed = False

    def put(self, batch: Any) -> bool:
        """Queue ``batch`` (any thread); False when the mailbox is closed or holds
        ``max_pending`` batches already (the stream sends more than its window)."""
        with self._lock:
            if self._closed or len(self._items) >= self._max_pending:
                return False
            self._items.append(batch)
            if self._draining:
                return True  # the running round's loop takes it next
            self._draining = True
        try:
            self._executor.submit(self._drain)
        except RuntimeError:  # the executor is shut down: the server is stopping
            with self._lock:
                self._draining = False
                self._closed = True
            return False
        return True

    @property
    def full(self) -> bool:
        """Whether ``max_pending`` batches wait (a :meth:`put` now is refused)."""
        with self._lock:
            return len(self._items) >= self._max_pending

    def close(self) -> None:
        """Take nothing more; batches queued and not yet taken are dropped (never acked)."""
        with self._lock:
            self._closed = True
            self._items.clear()

    def _drain(self) -> None:
        while True:
            with self._lock:
                if self._closed or not self._items:
                    self._draining = False
                    return
                batches = list(self._items)
                self._items.clear()
            failed = False
            try:
                result = self._take(batches)
            except Exception as exc:  # a defect: delivered, so the stream ends with it
                result, failed = exc, True
            try:
                self._deliver(result)
            except Exception:  # the stream's loop is closed (server stopping)
                failed = True
            if failed:
                self.close()
