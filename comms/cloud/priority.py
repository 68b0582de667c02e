"""Lower the OS scheduling priority of the calling thread (Linux: ``nice`` is per thread).

Publishing weights (reading the learner's file, hashing, delta encoding) is bulk work that can
wait a few milliseconds; a learner sharing the machine's cores cannot. ``robofleet bench
weights`` reports the learner's step time with a push every second against none.
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger(__name__)


def lower_this_thread(nice: int) -> None:
    """Add ``nice`` (0..19) to the calling thread's nice value; threads it starts inherit it.

    Raising the nice value needs no privilege; where the OS refuses, the thread keeps its
    priority (logged once at debug level).
    """
    if nice <= 0 or not hasattr(os, "setpriority"):
        return
    tid = threading.get_native_id()
    try:
        current = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, current + nice))
    except OSError as exc:
        log.debug("thread priority unchanged: %s", exc)
