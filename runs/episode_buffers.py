"""How the dashboard reaches a run's replay buffer to show and label its episodes
(``runs.episode_view`` reads them).

Reading: when the dashboard runs in the cloud's process and the run is live there, the run's
own open buffer (``CloudServer.run_sink(run_id).buffer``) is read under its lock, beside its
writer. Otherwise (a dashboard in its own process, a sharded run whose shards are other
processes, an ended run) each buffer directory (``<run_dir>/buffer``, or its ``shard-<k>``
directories) is opened read-only: no lock is taken and nothing is written; a WAL tail being
written is skipped, so a read sees the rows durable when it opened. Read-only handles are
shared for ``ttl_s`` and closed only once no request uses them. An open that races retention
(a segment deleted between listing and mapping) is retried.

Labelling: through the run's live sink when there is one (the path the robots' own labels
take), else by opening the directory writable for the moment of the mark; a directory another
process holds is refused with :class:`BufferHeld`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from buffer import BufferSettings, ReplayBuffer
from buffer.errors import CorruptDataError, ReplayBufferError
from buffer.service.shards import shard_count, shard_dir, shard_of
from buffer.table.opening import SCHEMA_FILE, SHARDS_FILE
from foundation.contracts import EpisodeRefused, EpisodesUnavailable

OPEN_TRIES = 3


class BufferHeld(EpisodeRefused):
    """The buffer directory is open for writing in another process."""


class BufferUnreadable(EpisodesUnavailable):
    """The buffer could not be opened for reading (after retries); ``str`` says why."""


@runtime_checkable
class RunSinks(Protocol):
    """The cloud's sinks by run (``comms.cloud.server.CloudServer``)."""

    def run_sink(self, run_id: str) -> Any: ...


def live_sink(control: object, run_id: str) -> Any:
    """The run's live sink in this process, or None."""
    return control.run_sink(run_id) if isinstance(control, RunSinks) else None


def buffer_dirs(run_dir: Path) -> list[Path]:
    """The buffer directories of a run: ``<run_dir>/buffer`` or its shards (only those that
    hold a buffer; empty when none does yet)."""
    root = run_dir / "buffer"
    if (root / SHARDS_FILE).exists():
        dirs = [shard_dir(root, k) for k in range(shard_count(root))]
    else:
        dirs = [root]
    return [d for d in dirs if (d / SCHEMA_FILE).exists()]


def robot_dir(run_dir: Path, robot_id: str) -> Path:
    """The directory holding ``robot_id``'s steps (its shard in a sharded run)."""
    root = run_dir / "buffer"
    if (root / SHARDS_FILE).exists():
        return shard_dir(root, shard_of(robot_id, shard_count(root)))
    return root


@dataclass
class _Handle:
    buffer: ReplayBuffer
    opened: float
    users: int = 0
    retired: bool = False


def _open_read_only(directory: Path) -> ReplayBuffer:
    settings = BufferSettings(prefetch=False)
    last: Exception | None = None
    for _ in range(OPEN_TRIES):
        try:
            return ReplayBuffer.open(directory, settings=settings, read_only=True)
        except (OSError, CorruptDataError) as exc:  # retention deleted a file meanwhile
            last = exc
            time.sleep(0.05)
        except (ValueError, ReplayBufferError) as exc:
            raise BufferUnreadable(f"{directory}: {exc}") from None
    raise BufferUnreadable(f"{directory}: {last}")


class RunBuffers:
    """Shared read-only handles of buffer directories (see the module docstring)."""

    def __init__(self, ttl_s: float = 2.0) -> None:
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._handles: dict[Path, _Handle] = {}

    def _acquire(self, directory: Path) -> _Handle:
        with self._lock:
            h = self._handles.get(directory)
            if h is not None and time.monotonic() - h.opened < self.ttl_s:
                h.users += 1
                return h
        fresh = _Handle(_open_read_only(directory), time.monotonic(), users=1)
        with self._lock:
            old = self._handles.get(directory)
            self._handles[directory] = fresh
        if old is not None:
            self._retire(old)
        return fresh

    def _retire(self, h: _Handle) -> None:
        with self._lock:
            h.retired = True
            close = h.users == 0
        if close:
            h.buffer.close()

    def _release(self, h: _Handle) -> None:
        with self._lock:
            h.users -= 1
            close = h.retired and h.users == 0
        if close:
            h.buffer.close()

    def forget(self, directory: Path) -> None:
        """Drop the shared handle of ``directory`` (its marks changed)."""
        with self._lock:
            h = self._handles.pop(directory, None)
        if h is not None:
            self._retire(h)

    @contextmanager
    def readers(self, control: object, run_id: str, run_dir: Path) -> Iterator[list[ReplayBuffer]]:
        """The run's buffers to read (one, or one per shard), held while the block runs.

        Raises:
            BufferUnreadable: a directory could not be opened.
        """
        sink = live_sink(control, run_id)
        if isinstance(getattr(sink, "buffer", None), ReplayBuffer):
            yield [sink.buffer]
            return
        held: list[_Handle] = []
        try:
            for d in buffer_dirs(run_dir):
                held.append(self._acquire(d))
            yield [h.buffer for h in held]
        finally:
            for h in held:
                self._release(h)

    def mark(
        self,
        control: object,
        run_id: str,
        run_dir: Path,
        key: tuple[str, int],
        kind: str,
        reason: str,
    ) -> int:
        """Mark episode ``key`` (``(robot_id, episode_index)``) of the run ``kind`` with
        ``reason``; returns the rows it applies to now.

        Raises:
            BufferHeld: no live sink here and another process holds the directory.
            BufferUnreadable: the directory holds no buffer.
        """
        robot_id, episode = key
        sink = live_sink(control, run_id)
        if sink is not None:
            return int(sink.mark_episode(int(robot_id), run_id, episode, kind, reason))
        directory = robot_dir(run_dir, robot_id)
        if not (directory / SCHEMA_FILE).exists():
            raise BufferUnreadable(f"{directory}: no buffer")
        try:
            buf = ReplayBuffer.open(directory, settings=BufferSettings(prefetch=False))
        except BlockingIOError:
            raise BufferHeld(
                f"{directory} is open in another process: label from the dashboard of the "
                "cloud that runs it"
            ) from None
        try:
            return buf.mark_episode(robot_id, run_id, episode, kind, reason)
        finally:
            buf.close()
            self.forget(directory)
