"""A run's files waiting for disk space, said without flooding: :class:`DiskFullNotice`."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class DiskFullNotice:
    """Logs and records (event ``run.disk_full``, data ``reason``) that a file of the run could
    not be written for a full disk, at most once per ``every_s`` seconds.

    Args:
        run_id: the run, named in the log line.
        event: records an event of the run: ``event(kind, **data)``.
        every_s: seconds between two notices.
    """

    def __init__(self, run_id: str, event: Callable[..., Any], every_s: float = 60.0) -> None:
        self.run_id = run_id
        self.event = event
        self.every_s = every_s
        self._said = -1e9  # time.monotonic() of the last notice

    def note(self, exc: OSError) -> None:
        """``exc`` (ENOSPC / EDQUOT) stopped a write; the run writes it at a later turn."""
        now = time.monotonic()
        if now - self._said < self.every_s:
            return
        self._said = now
        log.warning("run %s: disk full, its files wait for space: %s", self.run_id, exc)
        self.event("run.disk_full", reason=str(exc))
