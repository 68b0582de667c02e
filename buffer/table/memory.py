"""Arrays in their own anonymous mmaps: memory that goes back to the OS when freed.

numpy allocates through malloc, and glibc raises its mmap threshold each time a large
mmapped block is freed, so later large arrays come from the heap, whose freed memory
lingers (fragmentation): a buffer that replaces arrays as it grows (the row index doubling,
evicted chunks) would see its resident memory creep above what it holds. An array in its own
mapping is unmapped when the last reference to it goes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import math
import mmap
from typing import Any

import numpy as np

# madvise(MADV_POPULATE_WRITE) (Linux >= 5.14, include/uapi/asm-generic/mman-common.h) faults
# a range in for writing; called through ctypes, which releases the GIL for the call.
_MADV_POPULATE_WRITE = 23
POPULATE_CHUNK_BYTES = 1 << 20
_PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_libc.madvise.restype = ctypes.c_int
_madvise_populates = True  # until the kernel says EINVAL


def anon_array(shape: tuple[int, ...], dtype: np.dtype[Any], populate: bool = False) -> np.ndarray:
    """A zero-filled array in its own anonymous mmap (returned to the OS when freed).

    ``populate`` faults every page in now (:func:`populate`), so later writes do not pay page
    faults on the hot path (they are expensive on virtual machines). No transparent huge
    pages are asked: a fresh 2 MiB page needs compaction while the page cache is full of WAL
    pages.
    """
    count = math.prod(shape)
    size = max(1, count * dtype.itemsize)
    mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    arr = np.frombuffer(mm, dtype=dtype, count=count).reshape(shape)
    if populate:
        populate_pages(arr)
    return arr


def populate_pages(arr: np.ndarray) -> None:
    """Fault in every page of ``arr`` (an array of its own mapping, page-aligned), for
    writing, :data:`POPULATE_CHUNK_BYTES` at a time.

    Why in chunks and not MAP_POPULATE: populating holds the process's mmap lock for reading
    until done, and meanwhile every mmap or munmap of any thread waits for it, and page faults
    queue behind that waiting writer: appends would stall whenever the sealer made a spare
    tail; a chunk holds the lock briefly. Kernels without MADV_POPULATE_WRITE (before 5.14: EINVAL)
    get the pages touched instead, a write per page. Any other failure (ENOMEM) stops it:
    populating is only ahead of time, the pages fault in when written, as MAP_POPULATE would
    have left them.
    """
    global _madvise_populates
    flat = arr.reshape(-1).view(np.uint8)
    addr, size = flat.ctypes.data, flat.size
    for off in range(0, size, POPULATE_CHUNK_BYTES):
        n = min(POPULATE_CHUNK_BYTES, size - off)
        if _madvise_populates:
            if _libc.madvise(addr + off, n, _MADV_POPULATE_WRITE) == 0:
                continue
            if ctypes.get_errno() != errno.EINVAL:
                return
            _madvise_populates = False
        flat[off : off + n : _PAGE] = 0


def anon_arrays(
    specs: dict[str, tuple[tuple[int, ...], np.dtype[Any]]], populate: bool = False
) -> dict[str, np.ndarray]:
    """Zero-filled arrays ``{name: (shape, dtype)}`` carved from ONE anonymous mmap (64-byte
    aligned views): one mapping instead of one per column, so a cold chunk's small columns
    cost one VMA and round up to one page, not one each. ``populate``: as :func:`anon_array`."""
    offsets = {}
    total = 0
    for k, (shape, dtype) in specs.items():
        offsets[k] = total
        total += (math.prod(shape) * dtype.itemsize + 63) // 64 * 64
    block = anon_array((max(total, 1),), np.dtype(np.uint8), populate)
    out = {}
    for k, (shape, dtype) in specs.items():
        nbytes = math.prod(shape) * dtype.itemsize
        out[k] = block[offsets[k] : offsets[k] + nbytes].view(dtype).reshape(shape)
    return out
