"""Bandwidth cap for weight streams: a token bucket shared by every stream of one server."""

from __future__ import annotations

import asyncio
import time


class AsyncByteRate:
    """Spreads sends so that all streams together stay under ``bytes_per_s`` (0 = no cap).

    Single event loop only. Each ``take(n)`` reserves the next ``n / bytes_per_s`` seconds of
    the link and sleeps until its slot, with a burst allowance of ``burst_s`` seconds.
    """

    def __init__(self, bytes_per_s: float, burst_s: float = 0.05) -> None:
        self.bytes_per_s = bytes_per_s
        self.burst_s = burst_s
        self._next = time.monotonic()

    async def take(self, n: int) -> None:
        if self.bytes_per_s <= 0:
            return
        now = time.monotonic()
        start = max(self._next, now - self.burst_s)
        self._next = start + n / self.bytes_per_s
        delay = start - now
        if delay > 0:
            await asyncio.sleep(delay)
