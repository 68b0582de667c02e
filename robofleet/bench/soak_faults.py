"""The faults of ``robofleet bench soak`` that are not process kills: a robot's network cut (a
TCP proxy on its path to the cloud that stops carrying bytes), a disk that fills (a tmpfs filled
with a ballast file), idle weight subscriptions and a burst of reconnects."""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from comms.cloud.loop_thread import LoopThread
from comms.config import CommsSettings


class CutProxy:
    """Forwards ``127.0.0.1:port`` to ``target`` (``host:port``) until :meth:`cut`.

    A cut is a partition, not a reset: bytes stop flowing both ways, connections stay open,
    new ones are accepted and left silent, so each side finds out through its own deadlines
    and keepalives. :meth:`heal` aborts every connection the partition held (their TCP
    sessions would not survive it) and carries bytes again.
    """

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.cuts = 0
        self._loop = LoopThread("soak-proxy")
        self._conns: set[asyncio.StreamWriter] = set()
        self._flowing = asyncio.Event()
        self._loop.run(self._set_flowing())
        self._server = self._loop.run(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _set_flowing(self) -> None:
        self._flowing.set()

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self._conns.add(w)
        try:
            await self._flowing.wait()  # a connection made during a cut hears nothing
            tr, tw = await asyncio.open_connection(*self.target)
        except OSError:
            self._conns.discard(w)
            w.close()
            return
        self._conns.add(tw)
        await asyncio.gather(self._pipe(r, tw), self._pipe(tr, w), return_exceptions=True)
        self._conns.difference_update((w, tw))

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(65536):
                await self._flowing.wait()
                w.write(data)
                await w.drain()
        finally:
            w.close()

    def cut(self) -> None:
        """Stop carrying bytes (both ways, every connection, new ones too)."""

        async def go() -> None:
            self._flowing.clear()

        self._loop.run(go())
        self.cuts += 1

    def heal(self) -> None:
        """Abort what the cut held, then carry bytes again."""

        async def go() -> None:
            for w in list(self._conns):
                w.transport.abort()
            self._conns.clear()
            self._flowing.set()

        self._loop.run(go())

    def close(self) -> None:
        self.heal()
        self._server.close()
        self._loop.stop()


class FillableDisk:
    """A tmpfs of ``size_mib`` at ``mountpoint`` (needs root: ``mount``), filled to ENOSPC
    with a ballast file by :meth:`fill` and freed by :meth:`free`.

    Raises (on construction):
        PermissionError: the tmpfs could not be mounted (the reason from ``mount``).
    """

    def __init__(self, mountpoint: Path, size_mib: int) -> None:
        mountpoint.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(mountpoint)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise PermissionError(f"cannot mount a tmpfs (needs root): {done.stderr.strip()}")
        self.path = mountpoint
        self._ballast = mountpoint / f"ballast-{uuid.uuid4().hex}"

    def fill(self) -> int:
        """Write the ballast until the file system refuses; its bytes."""
        fd = os.open(self._ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        block = b"\0" * (1024 * 1024)
        written = 0
        try:
            while True:
                written += os.write(fd, block)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
        finally:
            os.close(fd)
        return written

    def free(self) -> None:
        self._ballast.unlink(missing_ok=True)

    def close(self) -> None:
        self.free()
        subprocess.run(["umount", "-l", str(self.path)], capture_output=True, check=False)


def _first_then_wait(first: Any, done: threading.Event) -> Iterator[Any]:
    """A request stream: ``first``, then nothing until ``done`` (the stream stays open)."""
    yield first
    done.wait()


def idle_subscriptions(
    address: str, credential: str, run_id: str, settings: CommsSettings, count: int, hold_s: float
) -> dict[str, Any]:
    """Open ``count`` weight subscriptions to ``run_id`` with a leased robot's ``credential``
    that take the first version's stream and then read and acknowledge nothing for ``hold_s``
    seconds; then cancel them. Returns how many the cloud had ended by itself by then and
    with which status codes (``ended_by_cloud``: code -> count)."""
    import grpc

    from comms.proto import robofleet_pb2 as pb
    from comms.robot.client import EdgeClient, make_channel

    done = threading.Event()
    clients, calls = [], []
    for _ in range(count):
        client = EdgeClient(make_channel(address, settings), credential, settings, address=address)
        first = pb.SubscribeRequest(run_id=run_id, have_version=0, data_plane=False)
        calls.append(
            client.weights.Subscribe(_first_then_wait(first, done), metadata=client.metadata)
        )
        clients.append(client)
    time.sleep(hold_s)
    ended: dict[str, int] = {}
    for call in calls:
        if call.done():
            code = call.code()
            name = code.name if isinstance(code, grpc.StatusCode) else str(code)
            ended[name] = ended.get(name, 0) + 1
    done.set()
    for call in calls:
        call.cancel()
    for client in clients:
        client.close()
    return {"opened": count, "held_s": hold_s, "ended_by_cloud": ended}


def reconnect_burst(
    address: str, credential: str, settings: CommsSettings, count: int
) -> dict[str, Any]:
    """``count`` times: a new connection with ``credential`` (a robot no run selects), one
    heartbeat, a Control stream opened and dropped, the connection closed. Returns how many
    heartbeats were answered and the seconds the burst took."""
    from comms.robot.client import ControlListener, EdgeClient, make_channel

    ok = failed = 0
    t0 = time.monotonic()
    for _ in range(count):
        client = EdgeClient(make_channel(address, settings), credential, settings, address=address)
        try:
            client.heartbeat("idle", None, {})
            listener = ControlListener(client, lambda _cmd: None)
            listener.connected.wait(2.0)
            listener.close()
            ok += 1
        except Exception:  # counted: the cloud refused or dropped this one
            failed += 1
        finally:
            client.close()
    return {"reconnects": count, "answered": ok, "failed": failed,
            "seconds": round(time.monotonic() - t0, 1)}  # fmt: skip
