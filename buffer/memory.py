"""Arrays in their own anonymous mmaps: memory that goes back to the OS when freed.

numpy allocates through malloc, and glibc raises its mmap threshold each time a large
mmapped block is freed, so later large arrays come from the heap, whose freed memory
lingers (fragmentation): a buffer that replaces arrays as it grows (the row index doubling,
evicted chunks) would see its resident memory creep above what it holds. An array in its own
mapping is unmapped when the last reference to it goes.
"""

from __future__ import annotations

import math
import mmap
from typing import Any

import numpy as np


def anon_array(shape: tuple[int, ...], dtype: np.dtype[Any], populate: bool = False) -> np.ndarray:
    """A zero-filled array in its own anonymous mmap (returned to the OS when freed).

    ``populate`` faults every page in now (MAP_POPULATE), so later writes do not pay page
    faults on the hot path (they are expensive on virtual machines). Transparent huge pages
    were tried: on this VM they cost more (every fresh 2 MiB page is zeroed in memory the
    host has to back first: ingest CPU 0.72 vs 0.48 s per bench round), so none are asked.
    """
    count = math.prod(shape)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    if populate:
        flags |= getattr(mmap, "MAP_POPULATE", 0)
    mm = mmap.mmap(-1, max(1, count * dtype.itemsize), flags=flags)
    return np.frombuffer(mm, dtype=dtype, count=count).reshape(shape)


def anon_arrays(
    specs: dict[str, tuple[tuple[int, ...], np.dtype[Any]]],
) -> dict[str, np.ndarray]:
    """Zero-filled arrays ``{name: (shape, dtype)}`` carved from ONE anonymous mmap (64-byte
    aligned views): one mapping instead of one per column, so a cold chunk's small columns
    cost one VMA and round up to one page, not one each."""
    offsets = {}
    total = 0
    for k, (shape, dtype) in specs.items():
        offsets[k] = total
        total += (math.prod(shape) * dtype.itemsize + 63) // 64 * 64
    block = anon_array((max(total, 1),), np.dtype(np.uint8))
    out = {}
    for k, (shape, dtype) in specs.items():
        nbytes = math.prod(shape) * dtype.itemsize
        out[k] = block[offsets[k] : offsets[k] + nbytes].view(dtype).reshape(shape)
    return out
