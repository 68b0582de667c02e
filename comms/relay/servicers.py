"""The relay's gRPC services for its robots: uploads and episode marks forwarded upstream
with each robot's own credential, weights served from the relay's copies."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

import grpc
import grpc.aio

from comms.cloud.services.common import ServerState, write
from comms.cloud.services.weights import WeightsServicer
from comms.config import CommsSettings
from comms.proto import robofleet_pb2 as pb
from comms.proto import robofleet_pb2_grpc as rpc
from comms.wire.credentials import AUTH_HEADER
from comms.wire.fanout import FANOUT_KEY_HEADER


class ServedRelay(Protocol):
    """What the servicers use of the relay that serves them (``comms.relay.site_relay``)."""

    settings: CommsSettings
    state: ServerState
    upstream_aio: grpc.aio.Channel | None
    upload_bytes: int

    def fanout_key(self, run_id: str) -> bytes: ...


def _auth_only(context: grpc.aio.ServicerContext) -> tuple[tuple[str, str], ...]:
    md = context.invocation_metadata() or ()
    return tuple((k, v if isinstance(v, str) else v.decode()) for k, v in md if k == AUTH_HEADER)


class RelayWeights(WeightsServicer):
    """The cloud's Weights service, served from the relay's copies. A Fetch the cloud
    authorized also hands the robot the run's fan-out key (initial metadata)."""

    def __init__(self, state: ServerState, relay: ServedRelay) -> None:
        super().__init__(state)
        self.relay = relay

    async def Fetch(self, request: pb.FetchRequest, context: grpc.aio.ServicerContext) -> None:
        try:
            await self._authorize(context, request.run_id)
        except Exception:
            pass  # refused (or failed) below by the service itself, with the right status
        else:
            key = self.relay.fanout_key(request.run_id)
            await context.send_initial_metadata(((FANOUT_KEY_HEADER, key.hex()),))
        await super().Fetch(request, context)


class RelayExperience(rpc.ExperienceServicer):
    def __init__(self, relay: ServedRelay) -> None:
        self.relay = relay

    async def Upload(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:  # type: ignore[override]
        md = _auth_only(context)
        if not md:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing robot credential")
        assert self.relay.upstream_aio is not None
        up = rpc.ExperienceStub(self.relay.upstream_aio).Upload(metadata=md)
        idle = self.relay.settings.stream_idle_timeout_s

        async def pump_up() -> None:
            while True:
                msg = await asyncio.wait_for(context.read(), idle)
                if msg is grpc.aio.EOF:
                    await up.done_writing()
                    return
                self.relay.upload_bytes += len(msg.arrow_ipc)
                # The cloud's data plane is not the relay's: robots here upload through us.
                msg.data_plane = False
                await up.write(msg)

        task = asyncio.create_task(pump_up())
        try:
            while True:
                ack = await up.read()
                if ack is grpc.aio.EOF:
                    break
                ack.ClearField("data_plane")
                await write(self.relay.state, context, ack)
            code = await up.code()
            if code != grpc.StatusCode.OK:
                await context.abort(code, await up.details())
        except grpc.aio.AioRpcError as exc:
            await context.abort(exc.code(), exc.details() or "upstream failed")
        finally:
            task.cancel()
            up.cancel()


class RelayEpisodes(rpc.EpisodesServicer):
    """A robot's episode marks, forwarded with its own credential (the cloud checks and
    stores them; its answer, or refusal, goes back as it is)."""

    def __init__(self, relay: ServedRelay) -> None:
        self.relay = relay

    async def Mark(  # type: ignore[override]
        self, request: pb.EpisodeMark, context: grpc.aio.ServicerContext
    ) -> pb.EpisodeMarkAck:
        md = _auth_only(context)
        if not md:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing robot credential")
        assert self.relay.upstream_aio is not None
        stub = rpc.EpisodesStub(self.relay.upstream_aio)
        try:
            return await stub.Mark(request, metadata=md, timeout=self.relay.settings.call_timeout_s)
        except grpc.aio.AioRpcError as exc:
            await context.abort(exc.code(), exc.details() or "upstream failed")
        raise AssertionError("unreachable")  # abort always raises
