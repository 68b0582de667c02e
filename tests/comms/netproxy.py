"""A TCP proxy for tests: counts bytes each way, adds latency, drops connections on demand."""

from __future__ import annotations

import asyncio
import threading

from comms.cloud.loop_thread import LoopThread


class TcpProxy:
    """Forwards ``listen_host:port`` -> ``target``; ``bytes_down`` counts target -> client."""

    def __init__(
        self, target: str, *, latency_s: float = 0.0, listen_host: str = "127.0.0.1"
    ) -> None:
        self.target_host, port = target.rsplit(":", 1)
        self.target_port = int(port)
        self.latency_s = latency_s
        self.bytes_up = 0
        self.bytes_down = 0
        self.connections = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = LoopThread("tcp-proxy")
        self._lock = threading.Lock()
        self._server = self._loop.run(self._start(listen_host))
        self.port = self._server.sockets[0].getsockname()[1]
        self.address = f"{listen_host}:{self.port}"

    async def _start(self, host: str) -> asyncio.Server:
        return await asyncio.start_server(self._handle, host, 0)

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            tr, tw = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            w.close()
            return
        self._writers.update((w, tw))
        await asyncio.gather(
            self._pipe(r, tw, up=True), self._pipe(tr, w, up=False), return_exceptions=True
        )
        self._writers.difference_update((w, tw))

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter, *, up: bool) -> None:
        try:
            while data := await r.read(65536):
                if self.latency_s:
                    await asyncio.sleep(self.latency_s)
                if up:
                    self.bytes_up += len(data)
                else:
                    self.bytes_down += len(data)
                w.write(data)
                await w.drain()
        finally:
            w.close()

    def drop_connections(self) -> None:
        """Cut every open connection (both sides see a reset/EOF)."""

        async def drop() -> None:
            for w in list(self._writers):
                w.transport.abort()

        self._loop.run(drop())

    def close(self) -> None:
        self.drop_connections()
        self._server.close()
        self._loop.stop()
