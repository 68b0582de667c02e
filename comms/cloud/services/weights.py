"""The Weights service: a run's policy versions streamed to subscribers, latest-only.

Each Subscribe call holds a window of one version: the newest is sent, then nothing until the
robot acknowledges it, so a slow robot skips versions instead of queueing them. With the data
plane the manifests stay here and the chunks go as ZeroMQ frames. Fetch serves a version's
chunks again (a repair) or its manifest alone.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio

from comms.cloud.dataplane import DataPlaneServer, Session
from comms.cloud.distributor import WeightDistributor
from comms.cloud.services.common import OpenStream, ServerState, guarded, identify, write
from comms.cloud.services.requests import BadRequest, read_message, require
from comms.proto import robofleet_pb2 as pb
from comms.proto import robofleet_pb2_grpc as rpc
from comms.wire.weight_codec import EncodedVersion


@dataclass
class _Subscriber:
    """One Subscribe call's robot: the version it holds (``have``), the newest it acknowledged
    (``done``), whether it may be sent the next one (``acked``), and an undecodable
    acknowledgement that ends the call (``error``)."""

    run_id: str
    have: int
    done: int
    session: Session | None
    acked: asyncio.Event = field(default_factory=asyncio.Event)
    closed: bool = False
    error: BadRequest | None = None

    async def read_acks(
        self, context: grpc.aio.ServicerContext, dp: DataPlaneServer | None
    ) -> None:
        try:
            while (ack := await read_message(context)) is not grpc.aio.EOF:
                self.have, self.done = int(ack.have_version), max(self.done, int(ack.done_version))
                if ack.data_plane_failed and self.session is not None and dp is not None:
                    dp.unbind(self.session)  # chunks go on this stream from now on
                self.acked.set()
        except BadRequest as exc:
            self.error = exc
        self.closed = True
        self.acked.set()


class WeightsServicer(rpc.WeightsServicer):
    def __init__(self, state: ServerState) -> None:
        self.s = state

    async def _send(
        self,
        context: grpc.aio.ServicerContext,
        enc: EncodedVersion,
        indices: list[int] | None,
        session: Session | None = None,
    ) -> None:
        s = self.s
        if session is not None and session.bound.is_set() and s.dataplane is not None:
            # The manifest here, the chunks on the data plane straight from the shared payload.
            await write(
                s, context, pb.WeightMessage(manifest=enc.manifest, chunks_on_data_plane=True)
            )
            s.dataplane.send_version(
                session, enc, list(range(enc.num_chunks)) if indices is None else indices
            )
            return
        await write(s, context, pb.WeightMessage(manifest=enc.manifest))
        for i in range(enc.num_chunks) if indices is None else indices:
            n = len(enc.chunk_view(i))
            await s.rate.take(n)
            # Pre-serialized (see comms.wire.payload_messages): one copy per chunk and subscriber.
            await write(s, context, enc.chunk_wire(i))
            s.weight_bytes_sent += n

    async def _authorize(self, context: grpc.aio.ServicerContext, run_id: str) -> WeightDistributor:
        ident = await identify(self.s, context)
        await asyncio.to_thread(self.s.auth.require_lease, ident, run_id)
        return self.s.distributor(run_id)

    @guarded
    async def Subscribe(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        """Latest-only with a window of one version per subscriber.

        The first request names the run and the version held; the newest version is sent, then
        nothing more until the subscriber acknowledges it (``done_version``), after which the
        newest at that moment follows, as a delta onto the acknowledged ``have_version`` when
        the distributor still holds that base. Versions published meanwhile are never queued,
        so a slow robot skips them and the server holds nothing per subscriber but the encoding
        being sent. The call ends when the subscriber closes its side.
        """
        first = await read_message(context)
        if first is grpc.aio.EOF:
            # Closed before asking (or ended by grpc: a frame over the message limit, already
            # answered RESOURCE_EXHAUSTED, where an abort here could not be sent).
            return
        require(first)
        dist = await self._authorize(context, first.run_id)
        dp = self.s.dataplane
        session = dp.open() if dp is not None and first.data_plane else None
        sub = _Subscriber(dist.run_id, int(first.have_version), int(first.have_version), session)
        sub.acked.set()
        reader = asyncio.create_task(sub.read_acks(context, dp))
        try:
            if session is not None:
                assert dp is not None
                await self._offer_data_plane(context, sub, dp, session)
            with OpenStream(self.s):
                while True:
                    await sub.acked.wait()
                    if sub.error is not None:
                        raise sub.error
                    if sub.closed:
                        return
                    enc = await self._newer(sub)
                    if enc is None:
                        continue
                    sub.acked.clear()
                    await self._send(context, enc, None, session)
        finally:
            reader.cancel()
            if session is not None and dp is not None:
                dp.close_session(session)

    async def _offer_data_plane(
        self,
        context: grpc.aio.ServicerContext,
        sub: _Subscriber,
        dp: DataPlaneServer,
        session: Session,
    ) -> None:
        await write(self.s, context, pb.WeightMessage(data_plane=dp.offer(session)))
        # Give the subscriber its handshake time, so a version waiting already (a late joiner,
        # a big model) goes on the data plane too; a robot that cannot reach it gets its first
        # version that much later, on this stream.
        deadline = time.monotonic() + self.s.settings.data_plane_handshake_s
        while not session.bound.is_set() and not sub.closed and time.monotonic() < deadline:
            await asyncio.sleep(0.005)

    async def _newer(self, sub: _Subscriber) -> EncodedVersion | None:
        """The newest version above what ``sub`` holds or acknowledged, encoded for it; None
        after waiting up to ``keepalive_time_s`` for one (the caller looks again)."""
        dist = self.s.distributor(sub.run_id)  # a distributor attached after a restart
        floor = max(sub.have, sub.done)
        latest = dist.latest()
        if latest is None or latest.version <= floor:
            ev = self.s.version_event(sub.run_id)
            latest = dist.latest()
            if latest is None or latest.version <= floor:
                try:
                    await asyncio.wait_for(ev.wait(), self.s.settings.keepalive_time_s)
                except TimeoutError:
                    pass
                return None
        return latest.for_subscriber(sub.have)

    @guarded
    async def Fetch(self, request: pb.FetchRequest, context: grpc.aio.ServicerContext) -> None:
        dist = await self._authorize(context, request.run_id)
        latest = dist.latest()
        if latest is not None and request.manifest_only and request.version < 0:
            await write(self.s, context, pb.WeightMessage(manifest=latest.full.manifest))
            return
        if latest is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"run {request.run_id!r} has no version yet"
            )
        assert latest is not None
        want = latest.version if request.version < 0 else int(request.version)
        enc = latest.get(int(request.base_version)) if latest.version == want else None
        if enc is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"version {want} (base {request.base_version}) is no longer held; latest is {latest.version}",
            )
        assert enc is not None
        bad = [i for i in request.indices if i >= enc.num_chunks]
        if bad:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"no chunk {bad[0]} in version {want}"
            )
        with OpenStream(self.s):
            await self._send(context, enc, list(request.indices) or None)
