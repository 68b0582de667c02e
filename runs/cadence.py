"""How often the run loop does each of its periodic jobs (metrics, hold, assignments,
reconcile): :class:`Every` says at a turn whether a job is due."""

from __future__ import annotations


class Every:
    """A job that runs at most once per ``interval_s`` (``time.monotonic`` seconds).

    Args:
        interval_s: seconds between two runs of the job.
        last: when it last ran; 0.0 makes it due at the first turn.
    """

    def __init__(self, interval_s: float, last: float = 0.0) -> None:
        self.interval_s = interval_s
        self.last = last

    def due(self, now: float) -> bool:
        """Whether the job is due at ``now``; a due job counts as run at ``now``."""
        if now - self.last < self.interval_s:
            return False
        self.last = now
        return True
