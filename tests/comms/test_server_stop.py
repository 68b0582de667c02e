"""Stopping the cloud's gRPC server leaves grpc's aio poller quiet (no traceback on shutdown).

grpc keeps one aio poller per process: an aio channel another test left open in the same
pytest-xdist worker keeps it alive, so the check runs in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

_CHECK = textwrap.dedent(
    """
    import asyncio, gc, sys, threading

    from comms.cloud.step_sink import MemorySink
    from tests.fakes.cloud import RUN, Cloud, migrated_store

    async def _thread_ident():
        return threading.get_ident()

    store = migrated_store(f"sqlite:///{sys.argv[1]}/meta.db", RUN)
    cloud = Cloud(store, MemorySink())
    robot = cloud.robot("arm-1")
    client = cloud.client(robot)
    client.heartbeat("running", None, {})
    client.close()
    extra = None
    if sys.argv[2] == "hold":  # the control case: another aio object keeps the poller
        import grpc
        extra = grpc.aio.insecure_channel("127.0.0.1:1")
    loop = cloud.server.state.loop
    loop_thread = asyncio.run_coroutine_threadsafe(_thread_ident(), loop).result(10)
    unsafe, calls = [], []
    remove_reader = loop.remove_reader

    def watched(fd):
        calls.append(fd)
        if loop.is_running() and threading.get_ident() != loop_thread:
            unsafe.append(threading.current_thread().name)
        return remove_reader(fd)

    loop.remove_reader = watched
    cloud.close()
    gc.collect()
    store.close()
    print(f"calls={len(calls)} unsafe={unsafe}")
    """
)


def _run(tmp_path: Path, mode: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", _CHECK, str(tmp_path), mode],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


def test_the_poller_lets_go_of_the_loop_only_once_it_stopped(tmp_path: Path) -> None:
    """grpc's poller removes its wake-up reader from the server's event loop when the last aio
    object is freed, from the freeing thread, then closes that socket: done from another
    thread while the loop runs, the loop's reader can run on the closed socket and print
    ``PollerCompletionQueue._handle_events ... OSError: [Errno 9]``. Here every such removal
    must find the loop stopped (or happen on the loop's own thread)."""
    line = _run(tmp_path, "alone")
    assert line.startswith("calls=") and not line.startswith("calls=0"), (
        f"the poller still holds the loop: {line}"
    )
    assert line.endswith("unsafe=[]"), f"reader removed from a running loop: {line}"


def test_the_check_sees_a_poller_another_aio_object_holds(tmp_path: Path) -> None:
    """The check above can fail: with another aio channel alive, the poller is not freed."""
    assert _run(tmp_path, "hold").startswith("calls=0 ")
