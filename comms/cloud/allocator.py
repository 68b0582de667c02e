"""glibc malloc settings for a process that receives step batches at a high rate.

libzmq allocates every received message with ``malloc``. A step batch is usually hundreds of
KB, above glibc's mmap threshold (128 KB, raised dynamically as such blocks are freed), and an
upload keeps a window of them alive at once; freed in bursts, they either go back to the kernel
(munmap, or a trim of the heap's top) and the next ones are faulted in page by page again, so
the receiving zmq thread can spend more time in page faults than in copying bytes. Raising the
mmap threshold to glibc's maximum and the trim threshold above an upload window keeps those
pages in the heap for the next messages (``robofleet bench transport`` shows the gain). The
price is up to ``trim_threshold`` bytes of freed heap kept resident.

This changes the whole process, so the server does it once, when its data plane starts and
``comms.tune_malloc`` is on; elsewhere (musl, macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

# mallopt parameters (glibc malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024  # glibc's cap on 64-bit (4 MiB * sizeof(long))

_applied: tuple[int, int] | None = None


def tune_for_messages(
    mmap_threshold: int = MMAP_THRESHOLD_MAX, trim_threshold: int = 64 * 1024 * 1024
) -> bool:
    """Set glibc's mmap and trim thresholds (bytes) for this process; returns whether it did.

    Idempotent; a later call with other values applies them. Returns False where there is no
    glibc ``mallopt`` or it refuses a value (nothing is changed then by this call's refused
    part; glibc keeps its defaults).
    """
    global _applied
    if _applied == (mmap_threshold, trim_threshold):
        return True
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and bool(
        mallopt(M_TRIM_THRESHOLD, trim_threshold)
    )
    if ok:
        _applied = (mmap_threshold, trim_threshold)
        log.debug("malloc: mmap threshold %d, trim threshold %d", mmap_threshold, trim_threshold)
    return ok


def trim() -> bool:
    """Hand the free pages of every malloc arena back to the kernel (glibc ``malloc_trim(0)``),
    e.g. after a burst of large objects that the raised thresholds kept in the heap; returns
    whether any memory was released (False where there is no glibc)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        malloc_trim = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    malloc_trim.argtypes = [ctypes.c_size_t]
    malloc_trim.restype = ctypes.c_int
    return bool(malloc_trim(0))
