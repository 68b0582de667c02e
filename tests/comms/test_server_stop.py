"""Stopping the cloud's gRPC server leaves grpc's aio poller quiet (no traceback on shutdown)."""

from __future__ import annotations

import asyncio
import gc
import threading
from typing import Any

from comms.cloud.step_sink import MemorySink
from foundation.store.metadata_store import MetadataStore
from tests.fakes.cloud import Cloud


async def _thread_ident() -> int:
    return threading.get_ident()


def test_the_poller_lets_go_of_the_loop_only_once_it_stopped(store: MetadataStore) -> None:
    """grpc's poller removes its wake-up reader from the server's event loop when the last aio
    object is freed, from the freeing thread, then closes that socket: done from another
    thread while the loop runs, the loop's reader can run on the closed socket and print
    ``PollerCompletionQueue._handle_events ... OSError: [Errno 9]``. Here every such removal
    must find the loop stopped (or happen on the loop's own thread)."""
    cloud = Cloud(store, MemorySink())
    robot = cloud.robot("arm-1")
    client = cloud.client(robot)
    client.heartbeat("running", None, {})
    client.close()
    loop = cloud.server.state.loop
    assert loop is not None
    loop_thread = asyncio.run_coroutine_threadsafe(_thread_ident(), loop).result(10)
    unsafe: list[str] = []
    calls: list[Any] = []
    remove_reader = loop.remove_reader

    def watched(fd: Any) -> bool:
        calls.append(fd)
        if loop.is_running() and threading.get_ident() != loop_thread:
            unsafe.append(threading.current_thread().name)
        return remove_reader(fd)

    loop.remove_reader = watched  # type: ignore[method-assign]
    cloud.close()
    gc.collect()
    assert calls, "the poller still holds the loop (another aio object alive?)"
    assert unsafe == [], f"reader removed from a running loop by {unsafe}"
