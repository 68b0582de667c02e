"""Messages a retried ``SendTransitions`` call sends again, recognised and not stored twice.

LeRobot's channel retries calls that fail ``UNAVAILABLE`` (``grpc_channel_options``), and gRPC
retries a client stream whose server sent no response yet by replaying it from its first
message (while it fits gRPC's retry buffer, 256 KiB by default). After a dropped connection or
a quick gateway restart, the messages a call had already delivered thus arrive again, as the
first messages of a new call. The guard keeps the digests of the first messages of recent
calls (up to ``window_bytes`` each) in the run's spool directory; a new call whose messages
repeat, from its first one and in order, those of a recent call is a replay, and they are
skipped. A message is recorded once handled (stored, refused, or itself a replay) and after it
is durable in the spool: a crash between the two may
store one message twice, never lose one.
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

from foundation.durable import atomic_write_json

FILE_NAME = "lerobot_calls.json"


class ReplayGuard:
    """The digests of recent calls' first messages, kept in ``directory``.

    Args:
        directory: the run's spool directory.
        window_bytes: bytes of a call's first messages recorded (above gRPC's retry buffer).
        keep: how many recent calls are remembered.
    """

    def __init__(self, directory: Path, window_bytes: int = 1 << 20, keep: int = 8) -> None:
        self.path = directory / FILE_NAME
        self.window_bytes = window_bytes
        self.keep = keep
        self._lock = threading.Lock()
        self._calls: list[list[str]] = []
        if self.path.exists():
            try:
                self._calls = [list(map(str, c)) for c in json.loads(self.path.read_text())]
            except (ValueError, TypeError):
                self._calls = []  # a lost record only weakens the guard

    def call(self) -> CallCursor:
        """A new call's cursor (remembered among the recent calls)."""
        with self._lock:
            earlier = [list(c) for c in self._calls]
            self._calls.append([])
            self._calls = self._calls[-self.keep :]
            return CallCursor(self, self._calls[-1], earlier)

    def _save(self) -> None:
        atomic_write_json(self.path, self._calls)


class CallCursor:
    """One call's place: whether its next message replays an earlier call's."""

    def __init__(self, guard: ReplayGuard, own: list[str], earlier: list[list[str]]) -> None:
        self._guard = guard
        self._own = own
        self._candidates = earlier
        self._index = 0
        self._bytes = 0

    def replayed(self, message: bytes) -> bool:
        """Whether ``message`` repeats, at this position, a recent call that began the same
        way (then it is not stored again). Call once per message, in order."""
        digest = hashlib.blake2b(message, digest_size=16).hexdigest()
        i = self._index
        self._candidates = [c for c in self._candidates if len(c) > i and c[i] == digest]
        self._index += 1
        self._digest = digest
        return bool(self._candidates)

    def record(self, message: bytes) -> None:
        """Record the message just checked as handled (stored, refused or a replay), while
        within the call's window: this call's positions are then known to a later replay."""
        self._bytes += len(message)
        if self._bytes > self._guard.window_bytes:
            return
        with self._guard._lock:
            self._own.append(self._digest)
            self._guard._save()
