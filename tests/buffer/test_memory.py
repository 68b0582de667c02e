"""``buffer.table.memory``: arrays in their own mappings, populated in chunks."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
from types import SimpleNamespace

import numpy as np
import pytest

from buffer.table import memory


def _resident_bytes(arr: np.ndarray) -> int:
    """Bytes of ``arr``'s pages in memory (mincore(2) over exactly its range)."""
    page = mmap.PAGESIZE
    n = (arr.nbytes + page - 1) // page
    vec = (ctypes.c_ubyte * n)()
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    assert libc.mincore(arr.ctypes.data, arr.nbytes, vec) == 0, ctypes.get_errno()
    return sum(b & 1 for b in vec) * page


SIZE = 3 * memory.POPULATE_CHUNK_BYTES + 12345  # a partial last chunk


def test_an_unpopulated_array_has_no_pages_until_written() -> None:
    arr = memory.anon_array((SIZE,), np.dtype(np.uint8))
    assert _resident_bytes(arr) == 0
    assert not arr.any()


def test_a_populated_array_is_resident_before_any_write() -> None:
    arr = memory.anon_array((SIZE // 4,), np.dtype(np.float32), populate=True)
    assert _resident_bytes(arr) >= SIZE
    assert not arr.any()  # still zero-filled


def test_a_kernel_without_madvise_populate_gets_every_page_touched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = []

    def refuse(addr: int, n: int, advice: int) -> int:
        calls.append(n)
        ctypes.set_errno(errno.EINVAL)  # a kernel before 5.14
        return -1

    monkeypatch.setattr(memory, "_libc", SimpleNamespace(madvise=refuse))
    monkeypatch.setattr(memory, "_madvise_populates", True)
    arr = memory.anon_array((SIZE,), np.dtype(np.uint8), populate=True)
    assert calls == [memory.POPULATE_CHUNK_BYTES]  # asked once, then known unsupported
    assert _resident_bytes(arr) >= SIZE
    assert not arr.any()
    again = memory.anon_array((SIZE,), np.dtype(np.uint8), populate=True)
    assert len(calls) == 1 and _resident_bytes(again) >= SIZE


def test_populating_stops_without_error_when_memory_is_short(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_memory(addr: int, n: int, advice: int) -> int:
        ctypes.set_errno(errno.ENOMEM)
        return -1

    monkeypatch.setattr(memory, "_libc", SimpleNamespace(madvise=no_memory))
    monkeypatch.setattr(memory, "_madvise_populates", True)
    arr = memory.anon_array((SIZE,), np.dtype(np.uint8), populate=True)
    assert _resident_bytes(arr) == 0  # nothing touched: the pages fault in when written
    arr[:] = 3
    assert int(arr.sum()) == 3 * SIZE
