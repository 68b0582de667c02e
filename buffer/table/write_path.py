"""The writer as its parts see it: :class:`WritePath`, what ``buffer.table.admission``,
``buffer.table.commit`` and ``buffer.table.watermark`` read and change of the writer that
composes them (``buffer.table.writer.Writer`` is the one), so no part depends on it."""

from __future__ import annotations

from typing import Protocol

from buffer.files.wal import StripedWal
from buffer.sampling.rate_limiter import RateLimiter
from buffer.table.chunks import Chunk
from buffer.table.sealer import Sealer
from buffer.table.state import TableState


class WritePath(Protocol):
    """The writer's state shared with its parts (read and written under ``state.lock``
    unless a method says otherwise) and the failure and rotation steps they call."""

    wal: StripedWal | None
    tail: Chunk | None
    failed: BaseException | None  # rows given out can no longer be durable
    recoveries: int  # recoveries from a failure
    unwritten: int  # appends given rows whose WAL record is not written yet
    claimed: int  # appends given rows that have not returned or raised yet
    rotating: bool  # an append is switching the WAL files (outside the lock)

    @property
    def state(self) -> TableState:
        """The buffer's shared state."""
        ...

    @property
    def sealer(self) -> Sealer:
        """Takes full tails (and is told when rows become visible)."""
        ...

    @property
    def rate_limiter(self) -> RateLimiter | None:
        """When set, every insert is admitted by it."""
        ...

    def recover(self) -> None:
        """Take appends again after a failure (``Writer.recover``)."""
        ...

    def refusal(self) -> OSError:
        """What an append raises while the failure noted is not recovered from."""
        ...

    def dropped_meanwhile(self) -> OSError:
        """What a pure retry raises when a recovery ran while it waited (locked)."""
        ...

    def fail(self, exc: BaseException) -> None:
        """Note the first failure (locked)."""
        ...

    def raise_disk_full(self, exc: BaseException) -> None:
        """Raise ``DiskFullError`` when ``exc`` is the file system running out of space."""
        ...

    def rotate(self, full: Chunk, first: int) -> None:
        """Close the WAL files of the full tail and continue from row ``first`` (unlocked)."""
        ...

    def tail_for(self, n: int) -> Chunk | None:
        """The open tail with room for ``n`` rows, or None when the caller rotates (locked)."""
        ...
