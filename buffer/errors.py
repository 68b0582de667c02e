"""Errors raised by the buffer; all derive from :class:`ReplayBufferError`."""

from __future__ import annotations

import errno
from typing import TypeGuard


class ReplayBufferError(Exception):
    """Base class of every error the buffer raises on purpose."""


class StepValidationError(ReplayBufferError, ValueError):
    """A record does not match the step schema; nothing of its batch was stored.

    Attributes:
        record: row of the offending record inside the batch (None when batch-wide).
        field: the offending column, ``"(record)"`` for a whole-record problem.
        robot_id, seq: of the offending record when known.
    """

    def __init__(
        self,
        message: str,
        *,
        record: int | None = None,
        field: str | None = None,
        robot_id: str | None = None,
        seq: int | None = None,
    ) -> None:
        super().__init__(message)
        self.record = record
        self.field = field
        self.robot_id = robot_id
        self.seq = seq


class NothingToSample(ReplayBufferError, ValueError):
    """No transition a sampler may draw (an empty window, none eligible, none of the kind
    it wants): wait for data. Also a ``ValueError``."""


class BackpressureError(ReplayBufferError):
    """The buffer cannot take more inserts now (rate limiter or closed).

    Attributes:
        retry_after_s: a hint how long the sender should wait before retrying.
    """

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class DiskFullError(ReplayBufferError, OSError):
    """The buffer's disk has no space (``ENOSPC`` / ``EDQUOT``): nothing of this append was
    stored or acknowledged (an episode mark: not stored); retry it later. Appends are taken again by themselves once space
    is back (the buffer needs no reopen). ``errno`` is the file system's.
    """

    def __init__(
        self, directory: object, cause: OSError, unstored: str = "nothing of this batch was stored"
    ) -> None:
        super().__init__(
            f"buffer disk full: {directory}: {cause.strerror or cause}; {unstored} (retry)"
        )
        self.errno = cause.errno
        self.directory = directory


def out_of_space(exc: BaseException | None) -> TypeGuard[OSError]:
    """Whether ``exc`` is the file system out of space (ENOSPC) or over a quota (EDQUOT)."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


class RateLimiterTimeout(ReplayBufferError, TimeoutError):
    """A blocking insert or sample waited past its timeout."""


class BufferClosedError(ReplayBufferError):
    """The buffer (or its rate limiter) was closed while an operation waited or started."""


class CorruptDataError(ReplayBufferError):
    """A sealed segment on disk fails its checks (never raised for a torn WAL tail)."""


class UnsupportedFormatError(ReplayBufferError):
    """A WAL or segment file has a format version (or marker) this code does not read.

    Nothing was read or changed; open it with a robofleet version that knows ``found``.

    Attributes:
        path: the refused file.
        found: the version or marker found in it (as text).
        supported: the format versions this code reads.
    """

    def __init__(self, path: object, found: str, supported: tuple[int, ...]) -> None:
        super().__init__(
            f"{path}: buffer file format {found} is not supported (this robofleet reads "
            f"format version(s) {', '.join(map(str, supported))})"
        )
        self.path = path
        self.found = found
        self.supported = supported


class SegmentGoneError(ReplayBufferError, FileNotFoundError):
    """Rows picked for a sample are no longer stored: retention deleted their segment
    between the picks and their read. ``ReplayBuffer`` then draws the batch again from the
    window left; a caller of the lower-level reads may do the same."""
