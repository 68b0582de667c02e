"""Where the control loop waits without acting: cloud holds, the first policy version, and a
help request nobody answered yet (``help.while_waiting: hold``, :mod:`edge_agent.help`).

While it waits the robot sends nothing and the uplink keeps draining the spool (a cloud hold
first flushes what was recorded so far to it). Both waits return at once on the agent's stop
and add their seconds to the loop's statistics (``hold_s``, ``weights_wait_s``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from edge_agent.control import CloudControl
from edge_agent.core import OperatorInput
from edge_agent.stats import LoopStats
from edge_agent.uplink import UplinkWorker


class Holds:
    """The loop's waits, woken by ``control``'s commands and by ``stop``."""

    def __init__(
        self,
        control: CloudControl,
        uplink: UplinkWorker,
        stop: threading.Event,
        stats: LoopStats,
    ) -> None:
        self.control = control
        self.uplink = uplink
        self.stop = stop
        self.stats = stats

    def cloud_hold(self, in_episode: bool = False) -> float:
        """Wait while the cloud holds the robot (e-stop or pause); returns the seconds held.
        ``in_episode`` (a pause inside an episode) also returns on an e-stop, so that the
        episode gets closed."""
        t0 = time.monotonic()
        self.uplink.flush()  # what is recorded so far goes to the spool and on to the cloud now

        def holding() -> bool:
            c = self.control
            return (c.paused and not c.estopped) if in_episode else c.holding

        while holding() and not self.stop.is_set():
            self.control.wait(0.1)
        held = time.monotonic() - t0
        self.stats.hold_s += held
        return held

    def first_weights(self, awaiting: Callable[[], bool]) -> None:
        """Wait while ``awaiting()`` (no policy version yet) and no command holds the robot."""
        t0 = time.monotonic()
        while awaiting() and not self.control.holding:
            if self.stop.is_set():
                break
            self.control.wait(0.05)
        self.stats.weights_wait_s += time.monotonic() - t0

    def for_help(
        self,
        waiting: Callable[[], bool],
        expire: Callable[[], object],
        poll: Callable[[], OperatorInput],
        period: float,
    ) -> tuple[OperatorInput | None, float]:
        """Wait while ``waiting()``: every ``period`` seconds (or at once on a cloud command)
        ``expire()`` ends an overdue request and ``poll()`` asks the operator; a takeover or an
        episode command ends the wait. Returns (the last operator input, None when never
        polled; the seconds held)."""
        t0 = time.monotonic()
        self.uplink.flush()
        op: OperatorInput | None = None
        while waiting():
            self.control.wait(period)
            expire()
            op = poll()
            if op.is_intervention or op.command:
                break
        return op, time.monotonic() - t0
