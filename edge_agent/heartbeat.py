"""The agent's heartbeat: its state, applied version and statistics, sent on a timer.

:class:`HeartbeatLoop` calls ``beat`` every ``interval_s`` seconds from a daemon thread while
the agent runs, and once more when it stops (the run's final numbers). A failed beat is
logged and skipped: a cloud outage must never stop the robot.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)


class HeartbeatLoop:
    """Sends heartbeats through ``beat`` (which reads the agent and calls the cloud).

    Args:
        beat: sends one heartbeat; may raise (the error is logged at INFO).
        interval_s: seconds between beats while :meth:`running`.
    """

    def __init__(self, beat: Callable[[], object], interval_s: float) -> None:
        self._send = beat
        self.interval_s = interval_s
        self._soon = threading.Event()

    def beat(self) -> None:
        """Send one heartbeat now (from any thread); never raises."""
        try:
            self._send()
        except Exception as exc:  # a cloud outage must not stop the robot
            log.info("heartbeat failed: %s", exc)

    def soon(self) -> None:
        """Ask the background thread for a beat now (from the control loop, which must not
        wait for the network); outside :meth:`running` the next beat carries it."""
        self._soon.set()

    @contextmanager
    def running(self) -> Iterator[None]:
        """Beat in the background while the ``with`` block runs, then once more at its end
        (after waiting up to 5 s for the background thread to finish)."""
        stop = threading.Event()
        thread = threading.Thread(
            target=self._loop, args=(stop,), name="edge-heartbeat", daemon=True
        )
        thread.start()
        try:
            yield
        finally:
            stop.set()
            self._soon.set()  # wakes the thread at once
            thread.join(5)
            self.beat()

    def _loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self._soon.wait(self.interval_s)
            self._soon.clear()
            if stop.is_set():
                return
            self.beat()
