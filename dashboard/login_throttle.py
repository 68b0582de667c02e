"""Failed-login throttling: a sliding window of failures per client and per (client, user).

A password guesser is stopped after a few failures: further attempts from that client for that
user are answered 429 with ``Retry-After`` *without* checking the password (scrypt is
deliberately slow, so checking it for every guess would also be a CPU sink). The per-client
limit is higher, so one address trying many usernames is stopped too, while the real user on
another address can still log in (no lock-out of an account by a stranger). State is in memory
of this dashboard process: a restart forgets it, and the number of tracked keys is bounded.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable


class LoginThrottle:
    """Counts failed logins and says how long a client must wait.

    Args:
        max_failures: failures of one (client, username) within ``window_s`` before waiting.
        max_failures_per_client: failures of one client (any usernames) within ``window_s``.
        window_s: the sliding window, seconds; a key waits until its oldest failure leaves it.
        max_keys: keys tracked at most (the least recently failed are forgotten first).
        clock: monotonic seconds (tests inject one).
    """

    def __init__(
        self,
        max_failures: int,
        max_failures_per_client: int,
        window_s: float,
        max_keys: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window_s = window_s
        self.max_keys = max_keys
        self._limits = {"user": max_failures, "client": max_failures_per_client}
        self._clock = clock
        self._failures: OrderedDict[tuple[str, ...], deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _keys(client: str, username: str) -> list[tuple[str, ...]]:
        return [("user", client, username), ("client", client)]

    def retry_after(self, client: str, username: str) -> float | None:
        """Seconds until ``client`` may try ``username`` again, or None when it may now."""
        now = self._clock()
        wait = 0.0
        with self._lock:
            for key in self._keys(client, username):
                times = self._failures.get(key)
                if times is None:
                    continue
                while times and times[0] <= now - self.window_s:
                    times.popleft()
                if len(times) >= self._limits[key[0]]:
                    wait = max(wait, times[0] + self.window_s - now)
        return wait if wait > 0 else None

    def failed(self, client: str, username: str) -> None:
        """Count a failed attempt."""
        now = self._clock()
        with self._lock:
            for key in self._keys(client, username):
                times = self._failures.pop(key, None) or deque(maxlen=self._limits[key[0]])
                times.append(now)
                self._failures[key] = times  # most recently failed last
            while len(self._failures) > self.max_keys:
                self._failures.popitem(last=False)

    def succeeded(self, client: str, username: str) -> None:
        """A correct password clears that user's failures from that client."""
        with self._lock:
            self._failures.pop(("user", client, username), None)
