"""``buffer.memory``: arrays in their own mappings, populated in chunks."""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
from types import SimpleNamespace

import numpy as np
import pytest

from buffer import memory


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


def test_without_madvise_populate_every_page_is_touched(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def refuse(addr: int, n: int, advice: int) -> int:
        calls.append(n)
        return -1  # EINVAL: a kernel before 5.14

    monkeypatch.setattr(memory, "_libc", SimpleNamespace(madvise=refuse))
    arr = memory.anon_array((SIZE,), np.dtype(np.uint8), populate=True)
    assert calls == [memory.POPULATE_CHUNK_BYTES] * 3 + [SIZE - 3 * memory.POPULATE_CHUNK_BYTES]
    assert _resident_bytes(arr) >= SIZE
    assert not arr.any()
