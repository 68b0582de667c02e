"""Batches delivered through shared memory when the learner and a batch server share a machine.

Over TCP loopback a ~50 MB camera batch costs two kernel copies (~37 ms on the development
machine), and a batch drawn from several shards one more copy to concatenate the parts. Here
the learner owns a few files in ``/dev/shm`` (:class:`BatchSlots`, one :class:`Slot` per
batch in flight); a ``sample`` request names one (``into``: :meth:`Slot.spec`) and the row its
shard's part starts at, and the server (:class:`SlotWriter`) copies its batch's columns
straight into the learner's arrays there and replies with a header alone. The shards of a
sharded buffer write their parts side by side into the same slot, so the learner's batch is
the slot's arrays, with no copy on its side.

A slot is handed out again only when nothing holds an array over it any more (numpy views,
``torch.from_numpy`` tensors: each keeps the slot's root array alive, so its reference
count tells), so a learner that keeps a batch keeps it intact. Whatever cannot use a slot (a
server on another machine, or in a container with another ``/dev/shm``, a layout the slot does
not have) falls back to the payload frames of ``buffer.service.payload``: the server says why
(``shm_refused``) and still sends the batch.

The server opens only regular files directly under ``/dev/shm`` whose names start with
:data:`PREFIX`, without following links, and checks every offset against the file's size.
"""

from __future__ import annotations

import contextlib
import logging
import math
import mmap
import os
import re
import stat
import sys
import tempfile
import time
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from buffer.service.payload import DTYPES, NAMES

log = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")
PREFIX = "robofleet-batch-"
ALIGN = 64  # each column starts on a cache line
MAX_SLOTS = 6  # a learner's slots at once; past it (batches held on to) it falls back to TCP
WRITER_CACHE = 16  # mapped slot files a server keeps open
PURGE_EVERY_S = 1.0  # how often a server unmaps the slots their learner removed


class ShmRefused(ValueError):
    """A slot the server cannot write this batch into (the reason in the message; ``layout``
    is true when the slot's columns are not the batch's, so the learner learns them again)."""

    def __init__(self, reason: str, layout: bool = False) -> None:
        super().__init__(reason)
        self.layout = layout


def boot_id() -> str:
    """This machine's kernel boot id (a learner and a server that report the same one share
    ``/dev/shm`` unless a container separates them); empty where there is none."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


Layout = dict[str, tuple[str, tuple[int, ...]]]  # column -> (safetensors dtype, row shape)


def layout_of(batch: Mapping[str, np.ndarray]) -> Layout | None:
    """The per-row layout of ``batch`` (every column's dtype and row shape); None when a
    column has no shared-memory form (a dtype without a safetensors name, no rows axis)."""
    out: Layout = {}
    for key, arr in batch.items():
        if arr.ndim == 0 or arr.dtype.newbyteorder("<").str not in NAMES:
            return None
        out[key] = (NAMES[arr.dtype.newbyteorder("<").str], tuple(int(d) for d in arr.shape[1:]))
    return out


def _offsets(layout: Layout, rows: int) -> tuple[dict[str, int], int]:
    """Where each column of ``rows`` rows starts in a slot, and the slot's size (bytes)."""
    offsets: dict[str, int] = {}
    at = 0
    for key, (dtype, shape) in layout.items():
        at += -at % ALIGN
        offsets[key] = at
        at += rows * math.prod(shape) * DTYPES[dtype].itemsize
    return offsets, max(at, 1)


class Slot:
    """One batch's shared-memory file, mapped by the learner: every column of ``layout`` for
    ``rows`` rows. ``in_use`` while any array over it is alive."""

    def __init__(self, layout: Layout, rows: int) -> None:
        self.layout = dict(layout)
        self.rows = rows
        self.offsets, self.size = _offsets(self.layout, rows)
        fd, name = tempfile.mkstemp(prefix=f"{PREFIX}{os.getpid()}-", dir=SHM_DIR)
        self.path = name
        try:
            # Reserved now: a /dev/shm too small for the slot (a container's 64 MiB) fails
            # here with ENOSPC, not with SIGBUS in the server that writes into it.
            os.posix_fallocate(fd, 0, self.size)
            self._mm = mmap.mmap(fd, self.size)
        except BaseException:
            os.close(fd)
            os.unlink(name)
            raise
        os.close(fd)
        self.root: np.ndarray = np.frombuffer(self._mm, dtype=np.uint8)
        self._unlink = weakref.finalize(self, _unlink_quietly, name)

    @property
    def in_use(self) -> bool:
        # One reference is ``self.root``, one the call's argument: any more is a live view.
        return sys.getrefcount(self.root) > 2

    def spec(self, row0: int) -> dict[str, Any]:
        """The request's ``into`` for a part starting at row ``row0``."""
        return {
            "path": self.path,
            "rows": self.rows,
            "row0": row0,
            "columns": {
                k: [self.offsets[k], dt, list(shape)] for k, (dt, shape) in self.layout.items()
            },
        }

    def arrays(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """Rows ``start:stop`` of every column: arrays over the file (no copy)."""
        return {
            k: _column(self.root, self.offsets[k], dt, shape, self.rows)[start:stop]
            for k, (dt, shape) in self.layout.items()
        }

    def close(self) -> None:
        """Unmaps and removes the file (arrays still over it keep the memory mapped)."""
        self._unlink()


def _column(
    root: np.ndarray, offset: int, dtype: str, shape: Sequence[int], rows: int
) -> np.ndarray:
    dt = DTYPES[dtype]
    count = rows * math.prod(shape)
    flat = root[offset : offset + count * dt.itemsize].view(dt)
    return flat.reshape(rows, *shape)


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


class BatchSlots:
    """A learner's slots (module docstring): :meth:`take` a free one for a batch's rows;
    :meth:`learn` the columns from a batch that came as frames. Not thread-safe: one per
    thread that asks for batches (``ShardedRemoteBuffer``'s prefetch thread has its own).

    Args:
        max_slots: slots at once; :meth:`take` returns None past it while all are held.
    """

    def __init__(self, max_slots: int = MAX_SLOTS) -> None:
        self.max_slots = max_slots
        self.layout: Layout | None = None
        self.failed = ""  # why no slot can be made here (e.g. /dev/shm is full): frames only
        self._slots: list[Slot] = []
        sweep_stale()

    def learn(self, batch: Mapping[str, np.ndarray]) -> None:
        """Take the columns of ``batch`` (received as frames) as every later slot's; slots of
        another layout are dropped once free."""
        layout = layout_of(batch)
        if layout != self.layout:
            self.layout = layout
            self._drop(lambda s: s.layout != layout)

    def take(self, rows: int) -> Slot | None:
        """A slot of ``rows`` rows nothing holds (made when none is free), or None: no layout
        learnt yet, ``max_slots`` held, or no slot can be made here (:attr:`failed`)."""
        if self.layout is None or rows <= 0 or self.failed:
            return None
        for s in self._slots:
            if s.rows == rows and s.layout == self.layout and not s.in_use:
                return s
        self._drop(lambda s: s.rows != rows)
        if len(self._slots) >= self.max_slots:
            return None
        try:
            slot = Slot(self.layout, rows)
        except OSError as exc:
            self.failed = f"cannot make a batch slot in {SHM_DIR}: {exc.strerror}"
            log.warning("%s: batches come over the socket", self.failed)
            return None
        self._slots.append(slot)
        return slot

    def _drop(self, unwanted: Any) -> None:
        keep = []
        for s in self._slots:
            if unwanted(s) and not s.in_use:
                s.close()
            else:
                keep.append(s)
        self._slots = keep

    def close(self) -> None:
        for s in self._slots:
            s.close()
        self._slots = []


def sweep_stale(directory: Path = SHM_DIR) -> int:
    """Remove slot files of learner processes that no longer run (a SIGKILLed learner's);
    returns how many."""
    removed = 0
    pattern = re.compile(re.escape(PREFIX) + r"(\d+)-")
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    for name in names:
        m = pattern.match(name)
        if m is None or _alive(int(m.group(1))):
            continue
        with contextlib.suppress(OSError):
            os.unlink(directory / name)
            removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class _Mapped:
    inode: tuple[int, int]
    size: int
    mm: mmap.mmap


class SlotWriter:
    """The server's side: writes a batch into the slot a request names (module docstring)."""

    def __init__(self, directory: Path = SHM_DIR, cache: int = WRITER_CACHE) -> None:
        self.directory = directory
        self.cache = cache
        self._mapped: OrderedDict[str, _Mapped] = OrderedDict()
        self._purged = time.monotonic()

    def write(self, into: Mapping[str, Any], batch: Mapping[str, np.ndarray]) -> int:
        """Copy ``batch`` (every column, ``n`` rows) into rows ``row0 : row0 + n`` of the slot
        ``into`` names; returns ``n``.

        Raises:
            ShmRefused: a path that is not a slot file, a file that cannot be opened or is too
                small, columns other than the batch's (``layout``), rows past the slot's end.
        """
        try:
            path = str(into["path"])
            rows, row0 = int(into["rows"]), int(into["row0"])
            columns = {
                str(k): (int(v[0]), str(v[1]), tuple(int(d) for d in v[2]))
                for k, v in dict(into["columns"]).items()
            }
        except (KeyError, TypeError, ValueError, IndexError):
            raise ShmRefused(f"malformed slot request {dict(into)!r}") from None
        n = len(next(iter(batch.values()))) if batch else 0
        if set(columns) != set(batch):
            raise ShmRefused(
                f"slot columns {sorted(columns)} are not the batch's {sorted(batch)}", layout=True
            )
        if row0 < 0 or row0 + n > rows:
            raise ShmRefused(f"rows {row0}..{row0 + n} past the slot's {rows}")
        end = 0
        for key, (offset, dt, shape) in columns.items():
            arr = batch[key]
            want = DTYPES.get(dt)
            if want is None or arr.dtype.newbyteorder("<") != want or arr.shape[1:] != shape:
                raise ShmRefused(
                    f"column {key!r}: the slot holds {dt} {list(shape)}, the batch "
                    f"{arr.dtype} {list(arr.shape[1:])}",
                    layout=True,
                )
            if offset < 0:
                raise ShmRefused(f"column {key!r} at offset {offset}")
            end = max(end, offset + rows * math.prod(shape) * want.itemsize)
        self._purge()
        mm = self._map(path, end)
        root = np.frombuffer(mm, dtype=np.uint8)
        try:
            for key, (offset, dt, shape) in columns.items():
                dst = _column(root, offset, dt, shape, rows)[row0 : row0 + n]
                np.copyto(dst, batch[key], casting="equiv")
        finally:
            del root  # the mapping can be closed once no array exports it
        return n

    def _map(self, path: str, needed: int) -> mmap.mmap:
        p = Path(path)
        if p.parent != self.directory or not p.name.startswith(PREFIX):
            raise ShmRefused(f"{path!r} is not a batch slot under {self.directory}")
        try:
            st = os.stat(p, follow_symlinks=False)
        except OSError as exc:
            raise ShmRefused(f"cannot see slot {path!r}: {exc.strerror}") from None
        known = self._mapped.get(path)
        if known is not None and known.inode == (st.st_dev, st.st_ino) and known.size >= needed:
            self._mapped.move_to_end(path)
            return known.mm
        if known is not None:
            self._forget(path)
        if not stat.S_ISREG(st.st_mode):
            raise ShmRefused(f"slot {path!r} is not a regular file")
        try:
            fd = os.open(p, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise ShmRefused(f"cannot open slot {path!r}: {exc.strerror}") from None
        try:
            size = os.fstat(fd).st_size
            if size < needed:
                raise ShmRefused(f"slot {path!r} has {size} bytes, the request needs {needed}")
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._mapped[path] = _Mapped((st.st_dev, st.st_ino), size, mm)
        while len(self._mapped) > self.cache:
            self._forget(next(iter(self._mapped)))
        return mm

    def _purge(self) -> None:
        """Unmap slots whose files are gone (a learner that closed or died): the mapping
        would keep their memory in use."""
        now = time.monotonic()
        if now - self._purged < PURGE_EVERY_S:
            return
        self._purged = now
        for path in [p for p in self._mapped if not os.path.exists(p)]:
            self._forget(path)

    def _forget(self, path: str) -> None:
        m = self._mapped.pop(path)
        with contextlib.suppress(BufferError):
            m.mm.close()

    def close(self) -> None:
        for path in list(self._mapped):
            self._forget(path)
