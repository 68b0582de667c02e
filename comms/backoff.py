"""Reconnect delays: exponential backoff with jitter (AWS architecture blog, "Exponential
Backoff And Jitter", 2015: the "equal jitter" variant keeps a floor so clients do not spin)."""

from __future__ import annotations

import random
import threading


class Backoff:
    """``next()`` returns delays ``d/2 + U(0, d/2)`` with ``d = min(max_s, initial_s * 2**n)``.

    Args:
        initial_s: the first delay's upper bound, seconds (> 0).
        max_s: the cap, seconds (>= initial_s).
    """

    def __init__(
        self, initial_s: float = 0.2, max_s: float = 10.0, rng: random.Random | None = None
    ):
        if initial_s <= 0 or max_s < initial_s:
            raise ValueError(f"need 0 < initial_s <= max_s, got {initial_s}, {max_s}")
        self.initial_s = initial_s
        self.max_s = max_s
        self._n = 0
        self._rng = rng or random.Random()

    def next(self) -> float:
        d = min(self.max_s, self.initial_s * (2 ** min(self._n, 30)))
        self._n += 1
        return d / 2 + self._rng.uniform(0, d / 2)

    def reset(self) -> None:
        self._n = 0

    def sleep(self, stop: threading.Event) -> bool:
        """Wait the next delay; returns True when ``stop`` was set meanwhile."""
        return stop.wait(self.next())
