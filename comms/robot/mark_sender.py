"""Episode marks from a robot: its operator's discard / rerecord verdicts and each kept
episode's outcome (success / failure), sent until stored.

The robot keeps each mark in a durable :class:`MarkOutbox` (the edge agent's is
``edge_agent.episodes.MarkOutbox``); :class:`EpisodeMarkSender` sends what is pending with the
Episodes service's ``Mark`` (the cloud stores it durably before answering) and takes it out
of the outbox once stored. A failed call is retried with backoff, so marks survive a cloud
restart and a robot offline for a while alike; a mark the cloud calls invalid
(INVALID_ARGUMENT) can never be stored and is dropped, logged and counted.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Protocol

import grpc

from comms.wire.marks import EpisodeMark
from foundation.retry import Backoff

if TYPE_CHECKING:
    from comms.robot.client import EdgeClient

log = logging.getLogger(__name__)


class MarkOutbox(Protocol):
    """A robot's marks not yet stored by the cloud (durable on the robot)."""

    def pending(self) -> list[EpisodeMark]:
        """Marks waiting for the cloud, oldest first."""
        ...

    def sent(self, mark: EpisodeMark) -> None:
        """The cloud stored ``mark`` (or refused it for good): take it out."""
        ...

    def wait(self, timeout: float) -> bool:
        """Block until a mark is added or ``timeout`` s pass; returns whether one was."""
        ...


class EpisodeMarkSender:
    """Sends a robot's pending marks on a background thread (started on construction).

    Args:
        client: the robot's client (cloud or site relay).
        outbox: where the marks wait.

    Attributes:
        stored: marks the cloud stored; ``refused``: marks it refused as invalid (dropped);
        last_error: the last failed call's code and details.
    """

    def __init__(self, client: EdgeClient, outbox: MarkOutbox) -> None:
        self._client = client
        self._outbox = outbox
        self._stop = threading.Event()
        self.stored = 0
        self.refused = 0
        self.last_error: str | None = None
        self._thread = threading.Thread(target=self._run, name="episode-marks", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        s = self._client.settings
        backoff = Backoff(s.reconnect_initial_s, s.reconnect_max_s)
        while not self._stop.is_set():
            marks = self._outbox.pending()
            if not marks:
                self._outbox.wait(0.5)
                continue
            if all(self._send(m) for m in marks):
                backoff.reset()
            elif backoff.sleep(self._stop):
                return

    def _send(self, mark: EpisodeMark) -> bool:
        """One mark to the cloud; False when it is to be tried again later."""
        try:
            self._client.mark_episode(mark)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            self.last_error = f"{code}: {exc.details() if hasattr(exc, 'details') else exc}"
            if code != grpc.StatusCode.INVALID_ARGUMENT:
                log.info("episode mark not stored yet (%s); retrying", self.last_error)
                return False
            self.refused += 1
            log.error("episode mark %s refused for good: %s", mark, self.last_error)
        else:
            self.stored += 1
        self._outbox.sent(mark)
        return True
