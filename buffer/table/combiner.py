"""Flat combining for the buffer's appends: one thread at a time stages every append that is
waiting (validate, de-duplicate, pass the rate limiter, claim rows), the others sleep until
their batch is staged and then write and fdatasync it themselves. The stage gets the whole
group, so it may also merge small appends into one (``buffer.table.writer``: one validation, WAL
record and fdatasync for many robots' small uploads).

Why: staging is many short Arrow and numpy calls; run by several threads at once, each
waits for the GIL between them (each call that releases the GIL lets another thread in, and
taking it back waits for that thread). One thread staging a queue of appends back to back
runs them near the single-thread cost, with one thread hand-off per group instead of
several per append (a plain lock around staging would hold it while an append waited for
the rate limiter). Rows are given
out one append at a time under the buffer's lock anyway; the copies into the WAL and the tail
and the fdatasyncs still run in parallel in the appending threads. Technique: Hendler et al.,
"Flat combining and the synchronization-parallelism tradeoff", SPAA 2010.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable


class Ticket:
    """One append waiting to be staged; ``error`` is what staging raised, if anything.

    ``parked``: set by a group stage that keeps the ticket after staging (its caller is woken
    later with :meth:`wake`, by whoever finishes it), instead of passing it to ``staged``.
    """

    __slots__ = ("_woken", "_lead", "error", "parked")

    def __init__(self) -> None:
        self._woken = threading.Event()
        self._lead = False
        self.error: BaseException | None = None
        self.parked = False

    def wake(self) -> None:
        """Let the caller of :meth:`Combiner.submit` of a parked ticket return."""
        self._woken.set()


# stage_group(group, staged): stage the tickets of ``group`` (in their order, the combiner's
# own last), passing each to ``staged`` as soon as it is staged (its caller wakes then), or
# parking it. It raises only for a failure that fails the tickets not staged or parked.
type GroupStage[T] = Callable[[list[T], Callable[[T], None]], None]


def one_at_a_time[T: Ticket](stage: Callable[[T], None]) -> GroupStage[T]:
    """A group stage running ``stage`` for each ticket; what it raises is kept in that
    ticket's ``error`` (and only that ticket fails)."""

    def stage_group(group: list[T], staged: Callable[[T], None]) -> None:
        for t in group:
            try:
                stage(t)
            except BaseException as exc:  # noqa: BLE001 - it is the ticket's error, raised there
                t.error = exc
            staged(t)

    return stage_group


class Combiner[T: Ticket]:
    """Runs ``stage_group`` for the tickets submitted, one group at a time, in arrival
    order but for the combiner's own (last of its group).

    The thread that finds no combiner at work becomes it: it takes the whole queue and
    stages it, each ticket's owner woken as soon as its ticket is staged, then hands the
    combiner's role to the owner of the first ticket queued meanwhile (so no caller serves
    others for longer than one group) and returns. Its own ticket is staged last: a stage
    may wait for the writes of tickets staged before it (a rotation waits for every row given
    out to be written), and the combiner writes its own only after the group.

    Args:
        stage_group: see :data:`GroupStage` (:func:`one_at_a_time` for a per-ticket stage).
    """

    def __init__(self, stage_group: GroupStage[T]) -> None:
        self._stage_group = stage_group
        self._lock = threading.Lock()
        self._queue: deque[T] = deque()
        self._busy = False

    def submit(self, ticket: T) -> None:
        """Return once ``ticket`` is staged (or failed: see ``ticket.error``), or, when the
        stage parked it, once it is woken (:meth:`Ticket.wake`)."""
        ticket.parked = False
        with self._lock:
            self._queue.append(ticket)
            lead = not self._busy
            self._busy = True
        while not lead:
            ticket._woken.wait()
            ticket._woken.clear()
            if not ticket._lead:
                return  # staged by another thread
            ticket._lead = False
            lead = True
        self._combine(ticket)

    def _combine(self, own: T) -> None:
        with self._lock:
            group = [t for t in self._queue if t is not own]
            group.append(own)  # last (see the class docstring)
            self._queue.clear()
        done: set[int] = set()

        def staged(t: T) -> None:
            done.add(id(t))
            if t is not own:  # the combiner's own is not waiting (and stays unset for a retry)
                t._woken.set()

        try:
            self._stage_group(group, staged)
        except BaseException as exc:  # noqa: BLE001 - the failed tickets' error, raised there
            for t in group:
                if id(t) not in done and not t.parked:
                    t.error = exc
                    staged(t)
        finally:
            with self._lock:
                if self._queue:
                    nxt = self._queue[0]
                    nxt._lead = True
                    nxt._woken.set()
                else:
                    self._busy = False
