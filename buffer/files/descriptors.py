"""Read-only file descriptors of sealed segments, shared by the process and bounded.

Cold rows are read with ``pread`` (``buffer.table.storage``), so a segment read once kept its files
open: 4 descriptors per segment (one per WAL stripe), for as long as the segment lived. A
fleet's buffer holds thousands of segments, so sampling across it would run into the
process's descriptor limit (``EMFILE``: 1,024 by default on many systems) and fail. Here at
most :data:`LIMIT` descriptors stay open, the least recently used one closed first; a
descriptor in use by a read is never closed under it (a closed number can be reused by the
next ``open``, so a read could otherwise get another file's bytes).

Descriptors are found by a key their segment owns (:func:`new_key`), not by path: a path can
name another file later (a buffer directory deleted and made again, a dataset replaced), and a
descriptor found by path would read the old one.
"""

from __future__ import annotations

import itertools
import os
import resource
import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Iterator
from contextlib import contextmanager


def _limit() -> int:
    """A quarter of the soft descriptor limit, at most 512 (sockets and logs need the rest)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 512
    return max(8, min(512, soft // 4))


LIMIT = _limit()
_keys = itertools.count()


def new_key() -> int:
    """A key no other segment object of this process has."""
    return next(_keys)


class _Entry:
    __slots__ = ("fd", "users", "forgotten")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.users = 0
        self.forgotten = False  # left the cache while in use: closed by its last user


class DescriptorCache:
    """Open read-only descriptors by key, at most ``limit`` kept open when unused (LRU).

    Thread-safe. More than ``limit`` may be open while that many reads are in flight.
    """

    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._open: OrderedDict[Hashable, _Entry] = OrderedDict()
        self.opens = 0  # descriptors opened (a reuse costs none)

    @contextmanager
    def open(self, key: Hashable, path: str) -> Iterator[int]:
        """A read-only descriptor of ``path`` (the file of ``key``) for the ``with`` block
        (do not close it).

        Raises:
            OSError: the file cannot be opened (gone, no permission, no descriptor left).
        """
        entry = self.acquire(key, path)
        try:
            yield entry.fd
        finally:
            self.release(entry)

    def acquire(self, key: Hashable, path: str) -> _Entry:
        """:meth:`open` without the context manager (a hot read path): read with
        ``entry.fd``, then :meth:`release` it exactly once."""
        with self._lock:
            entry = self._open.get(key)
            if entry is not None:
                self._open.move_to_end(key)
                entry.users += 1
                return entry
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)  # outside the lock: it may block
        with self._lock:
            entry = self._open.get(key)
            if entry is not None:  # another thread opened it meanwhile
                os.close(fd)
                self._open.move_to_end(key)
            else:
                entry = self._open[key] = _Entry(fd)
                self.opens += 1
            entry.users += 1
            self._trim()
            return entry

    def release(self, entry: _Entry) -> None:
        """End a read that :meth:`acquire` began."""
        with self._lock:
            entry.users -= 1
            if entry.users == 0 and entry.forgotten:
                os.close(entry.fd)
            else:
                self._trim()

    def _trim(self) -> None:
        """Close least recently used descriptors nobody reads with, down to ``limit``
        (locked)."""
        if len(self._open) <= self.limit:
            return
        for key in [k for k, e in self._open.items() if e.users == 0]:
            os.close(self._open.pop(key).fd)
            if len(self._open) <= self.limit:
                return

    def forget(self, keys: Iterable[Hashable]) -> None:
        """Close the descriptors of ``keys`` (a segment deleted or let go), at once or, while
        a read uses one, when that read ends."""
        with self._lock:
            for key in keys:
                entry = self._open.pop(key, None)
                if entry is None:
                    continue
                if entry.users:
                    entry.forgotten = True
                else:
                    os.close(entry.fd)

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)


DESCRIPTORS = DescriptorCache()
