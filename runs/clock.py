"""A run's clock: run time without paused time, and robot-seconds, carried across resumes.

The clock starts when the run's robots are up and its first policy version is out (what came
before is the run's ``setup_s``), so a loaded machine's start-up cannot eat ``stop.minutes``.
A resumed run starts from what ``progress.json`` recorded.
"""

from __future__ import annotations

import time


class RunClock:
    """Seconds of run time (``elapsed``) and robot-seconds (robots acting, not paused).

    Args:
        elapsed_base: run time of earlier attempts (a resumed run), seconds.
        robot_seconds: robot-seconds of earlier attempts.
    """

    def __init__(self, elapsed_base: float = 0.0, robot_seconds: float = 0.0) -> None:
        self.elapsed_base = elapsed_base
        self.robot_seconds = robot_seconds
        self.paused = False
        self._t0 = time.monotonic()
        self._paused_at = 0.0
        self._paused_total = 0.0
        self._last_tick: float | None = None

    def start(self) -> float:
        """The run's time starts now (robots up, first version out); returns the instant."""
        self._t0 = time.monotonic()
        return self._t0

    def pause(self) -> None:
        self.paused = True
        self._paused_at = time.monotonic()

    def resume(self) -> None:
        self._paused_total += time.monotonic() - self._paused_at
        self.paused = False

    def tick(self, robots: int) -> None:
        """Count ``robots`` acting since the last tick (none while paused)."""
        now = time.monotonic()
        if self._last_tick is not None and not self.paused:
            self.robot_seconds += robots * (now - self._last_tick)
        self._last_tick = now

    def elapsed(self) -> float:
        """Run time in seconds since the first version, without the time spent paused."""
        now = time.monotonic()
        paused = self._paused_total + (now - self._paused_at if self.paused else 0.0)
        return self.elapsed_base + (now - self._t0) - paused

    @property
    def robot_hours(self) -> float:
        return self.robot_seconds / 3600
