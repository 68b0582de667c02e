"""The prefetch thread: promotes the hottest cold segments into RAM in the background, so the
hot tier follows what is being sampled (cold picks heat their segment; see
``buffer.table.storage.TieredStorage.prefetch_candidate``)."""

from __future__ import annotations

import threading
import time

from buffer.table.storage import TieredStorage


def start_prefetcher(
    storage: TieredStorage, stop: threading.Event, interval_s: float
) -> threading.Thread:
    """Start the daemon thread; it promotes up to 4 segments every ``interval_s`` until
    ``stop`` is set."""
    t = threading.Thread(
        target=_prefetch, args=(storage, stop, interval_s), name="buffer-prefetch", daemon=True
    )
    t.start()
    return t


def _prefetch(storage: TieredStorage, stop: threading.Event, interval_s: float) -> None:
    while not stop.wait(interval_s):
        try:
            for _ in range(4):
                c = storage.prefetch_candidate()
                if c is None or not storage.promote(c):
                    break
        except Exception:  # noqa: BLE001 - a prefetch failure must not kill serving
            time.sleep(0.5)
