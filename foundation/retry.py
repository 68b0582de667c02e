"""Retry delays: exponential backoff, with optional jitter (floor; imports no robofleet package).

One owner for every "wait longer after each failure" in robofleet: comms' clients reconnecting
(uploads, weight subscriptions, the control stream, a relay registration), the supervisor
restarting a crashed learner and the run driver restarting a crashed edge agent.

Jitter is the "equal jitter" variant of the AWS Architecture Blog's "Exponential Backoff And
Jitter" (Marc Brooker, 2015): half of each delay is kept as a floor so clients never spin, the
other half is drawn at random so many clients that failed together do not retry together.
"""

from __future__ import annotations

import random
import threading


class Backoff:
    """Delays in seconds: the ``n``-th (``n`` = 0, 1, ...) has the bound
    ``d = min(max_s, initial_s * 2**n)``; it is ``d`` itself, or ``d/2 + U(0, d/2)`` with
    ``jitter``. :meth:`next` hands them out in turn, :meth:`reset` starts over (after a success).

    Args:
        initial_s: the first delay's bound, seconds (> 0).
        max_s: the cap, seconds (>= initial_s).
        jitter: draw equal jitter (for many clients); off, the delays are exact (a restart
            policy whose delays an operator reads in the log).
        rng: the random source of the jitter (tests pass a seeded one).

    Raises:
        ValueError: ``initial_s`` <= 0 or ``max_s`` < ``initial_s``.
    """

    def __init__(
        self,
        initial_s: float = 0.2,
        max_s: float = 10.0,
        *,
        jitter: bool = True,
        rng: random.Random | None = None,
    ) -> None:
        if initial_s <= 0 or max_s < initial_s:
            raise ValueError(f"need 0 < initial_s <= max_s, got {initial_s}, {max_s}")
        self.initial_s = initial_s
        self.max_s = max_s
        self.jitter = jitter
        self.attempts = 0  # delays handed out since the last reset
        self._rng = rng or random.Random()

    def delay(self, attempt: int) -> float:
        """The delay after ``attempt`` earlier failures (>= 0), without advancing."""
        d = min(self.max_s, self.initial_s * (2 ** min(max(0, attempt), 30)))
        return d / 2 + self._rng.uniform(0, d / 2) if self.jitter else d

    def next(self) -> float:
        """The next delay; each call doubles the bound until ``max_s``."""
        d = self.delay(self.attempts)
        self.attempts += 1
        return d

    def reset(self) -> None:
        """Start again from ``initial_s`` (call after a success)."""
        self.attempts = 0

    def sleep(self, stop: threading.Event) -> bool:
        """Wait the next delay; returns True when ``stop`` was set meanwhile."""
        return stop.wait(self.next())
