"""The control loop's clock: ticks at a fixed period, step timestamps, latency and overruns.

A step's *latency* is the time from its start (just before the policy acts) to the end of its
recording; a step whose latency plus the wait exceeds the period is an *overrun* and the next
tick starts at once instead of bursting to catch up. Timestamps count from the episode's first
step (0.0, as LeRobot stores them) and skip time spent paused. All times are
``time.monotonic()`` seconds.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from edge_agent.stats import LoopStats

log = logging.getLogger(__name__)


class StepClock:
    """The ticks of one episode (``period`` seconds apart), recorded into ``stats``."""

    def __init__(self, period: float, stats: LoopStats) -> None:
        self.period = period
        self.stats = stats
        self.t0 = self.next_tick = time.monotonic()
        self.last_tick: float | None = None

    def skip(self, held: float) -> None:
        """After a pause of ``held`` seconds: timestamps skip it, ticks restart from now."""
        self.t0 += held
        self.next_tick, self.last_tick = time.monotonic(), None

    def start(self, first: bool) -> float:
        """A step starts now (``first``: the episode's first step, timestamp 0)."""
        start = time.monotonic()
        if first:
            self.t0 = self.next_tick = start
        return start

    def timestamp(self, start: float) -> float:
        return start - self.t0

    def done(self, start: float) -> float:
        """The step begun at ``start`` is recorded: count its latency and period; returns now."""
        now = time.monotonic()
        self.stats.record(now - start, None if self.last_tick is None else start - self.last_tick)
        self.last_tick = start
        return now

    def wait_next(
        self, now: float, wait: Callable[[float], object], interrupted: Callable[[], bool]
    ) -> None:
        """Sleep until the next tick with ``wait(seconds)`` (which may return early), unless
        ``interrupted()``; count an overrun when the tick has already passed."""
        self.next_tick += self.period
        if now > self.next_tick:
            self.stats.overruns += 1
            self.next_tick = now
            return
        while now < self.next_tick and not interrupted():
            wait(self.next_tick - now)
            now = time.monotonic()


def set_realtime(priority: int) -> None:
    """SCHED_FIFO for the calling thread (pid 0 = this thread on Linux); warn when refused."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except (AttributeError, PermissionError, OSError) as exc:
        log.warning("control thread keeps the default scheduler (SCHED_FIFO refused: %s)", exc)
