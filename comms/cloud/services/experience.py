"""The Experience service: step batches in, acknowledgements of the durable seq out.

Batches come on the gRPC stream (split in parts under the message limit) or, when the client
asks and the server offers one, on the ZeroMQ data plane while the stream carries the acks.
Appends (Arrow parsing, the sink's fsync) run in worker threads so one slow robot never stalls
the event loop. After a refusal (backpressure) later batches are refused until the client
re-syncs, so nothing is stored out of order.

One live Upload stream per robot: acks are a robot's highest durable seq, which speaks for
every step of one producer sending in order; two streams of one robot (two agents with one
credential) would each have the other's rows acknowledged as theirs. A second stream is
refused (ALREADY_EXISTS, naming the robot) while the first lives; the claim goes when the
first's call ends in any way (finished, cancelled, or dropped by keepalive or the idle timeout
when its peer vanished), so a restarted robot computer gets in on its next retry.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
import numpy as np

from comms.cloud.dataplane import DataPlaneServer
from comms.cloud.services.common import (
    SINK_REFUSALS,
    OpenStream,
    ServerState,
    guarded,
    identify,
    write,
)
from comms.cloud.services.mailbox import Mailbox
from comms.cloud.services.requests import BadRequest, read_message, require
from comms.cloud.services.sink_events import SinkFullEvents
from comms.cloud.step_sink import Backpressure, SinkClosed, SinkFull, StepSink
from comms.proto import robofleet_pb2 as pb
from comms.proto import robofleet_pb2_grpc as rpc
from comms.wire import steps as S


class BatchTooLarge(ValueError):
    """A step batch over ``comms.max_upload_batch_bytes``."""


_REFUSALS: dict[type[Exception], grpc.StatusCode] = {
    BatchTooLarge: grpc.StatusCode.RESOURCE_EXHAUSTED,
    S.StepFormatError: grpc.StatusCode.INVALID_ARGUMENT,
    S.ForeignRowsError: grpc.StatusCode.PERMISSION_DENIED,
    **SINK_REFUSALS,
}


@dataclass
class _Upload:
    """One upload stream's position, used by one worker-thread hop at a time."""

    robot_id: int
    run_id: str
    sink: StepSink
    lock: threading.Lock
    durable: int
    max_bytes: int
    resync: bool = False
    rows: int = 0
    refused: Exception | None = None  # the refusal that ends this stream

    def take(self, data: Any) -> pb.UploadAck:
        """Acknowledge one whole batch (empty: a hello / re-sync) after storing its new rows.

        After backpressure later batches are answered with backpressure too, until the client
        re-syncs; after a refusal that ends the stream every later batch gets that refusal.
        Either way nothing is stored past a batch that was not: batches already in flight
        behind it would be acknowledged with a durable seq that covers its seqs, and the
        robot would drop steps the sink never stored (a gap is a legal seq sequence, so the
        sink cannot tell).

        Raises:
            StepFormatError, ForeignRowsError, SinkRejected, SinkFull, SinkClosed,
                BatchTooLarge: the stream must be ended.
        """
        if self.refused is not None:
            raise self.refused
        if not len(data):
            self.resync = False  # the client resends from ``durable``
            return pb.UploadAck(durable_seq=self.durable)
        ack = pb.UploadAck(durable_seq=self.durable)
        try:
            if len(data) > self.max_bytes:
                raise BatchTooLarge(f"step batch over {self.max_bytes} bytes")
            rows, self.durable = _ingest(
                data,
                self.robot_id,
                self.run_id,
                self.durable,
                None if self.resync else self.sink,
                self.lock,
            )
        except tuple(_REFUSALS) as exc:
            self.refused = exc
            raise
        except Backpressure as bp:
            ack.backpressure = True
            ack.retry_after_ms = int(bp.retry_after_s * 1000)
            ack.reason = str(bp)
            self.resync = True
            return ack
        self.rows += rows
        ack.durable_seq = self.durable
        if self.resync:
            ack.backpressure = True
            ack.reason = "resync after backpressure"
        return ack

    def take_all(
        self, batches: list[Any]
    ) -> tuple[list[tuple[pb.UploadAck, bool]], Exception | None, int]:
        """:meth:`take` for several batches in one worker-thread hop; stops at the first
        refusal (a batch over ``max_bytes`` is one).

        Returns:
            ([(ack, whether it is a plain batch ack: stored, no backpressure)], the refusal,
            rows stored).
        """
        acks: list[tuple[pb.UploadAck, bool]] = []
        before = self.rows
        for data in batches:
            try:
                ack = self.take(data)
            except tuple(_REFUSALS) as exc:
                return acks, exc, self.rows - before
            acks.append((ack, len(data) > 0 and not ack.backpressure))
        return acks, None, self.rows - before


def _coalesce(acks: list[tuple[pb.UploadAck, bool]]) -> list[pb.UploadAck]:
    """Runs of plain batch acks (stored, no backpressure) as one ack carrying the last durable
    seq and the run's length; hello and backpressure acks stay single."""
    out: list[pb.UploadAck] = []
    run = 0
    for ack, plain in acks:
        if plain and run:
            out[-1].durable_seq = ack.durable_seq
            run += 1
            out[-1].batches = run
            continue
        out.append(ack)
        run = 1 if plain else 0
    return out


class _LiveStreams:
    """Which robots have a live Upload stream (the module docstring says why only one)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: dict[int, object] = {}  # robot id -> the token of its live stream

    def claim(self, robot_id: int) -> object | None:
        """A token for a new stream of ``robot_id``; None while another one is live."""
        with self._lock:
            if robot_id in self._owner:
                return None
            token = self._owner[robot_id] = object()
            return token

    def release(self, robot_id: int, token: object) -> None:
        """End the claim of ``token`` (idempotent; a newer stream's claim is kept)."""
        with self._lock:
            if self._owner.get(robot_id) is token:
                del self._owner[robot_id]


class ExperienceServicer(rpc.ExperienceServicer):
    def __init__(self, state: ServerState) -> None:
        self.s = state
        recorder = state.events if state.events is not None else state.metadata_store()
        self.sink_full = SinkFullEvents(recorder)
        self.live = _LiveStreams()

    @guarded
    async def Upload(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        """Step batches in, acks with the durable seq out. The opening (empty) message names
        the run; when it asks for the data plane and one is offered, the batches come there
        and this stream carries only the acks."""
        s = self.s
        ident = await identify(s, context)
        first = await self._read(context)
        if first is grpc.aio.EOF:
            return
        require(first)
        run_id = first.run_id
        await asyncio.to_thread(s.auth.require_lease, ident, run_id)
        sink = s.sinks(run_id)
        if sink is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown run {run_id!r}")
        assert sink is not None
        token = self.live.claim(ident.robot_id)
        if token is None:
            await context.abort(
                grpc.StatusCode.ALREADY_EXISTS,
                f"robot {ident.name} already has a live upload stream; this one is refused "
                "until that stream ends",
            )
        # Released by gRPC when the call terminates (done, cancelled, peer gone) and by the
        # finally when this handler returns or raises, whichever comes first.
        context.add_done_callback(lambda _ctx: self.live.release(ident.robot_id, token))
        try:
            try:
                durable = await asyncio.to_thread(sink.durable_seq, ident.robot_id)
            except (Backpressure, SinkClosed) as exc:  # a shard away; the run stopping
                await context.abort(grpc.StatusCode.UNAVAILABLE, f"upload: {exc}")
            lock = s.robot_lock(run_id, ident.robot_id)
            limit = s.settings.max_upload_batch_bytes
            up = _Upload(ident.robot_id, run_id, sink, lock, durable, limit)
            with OpenStream(s):
                if first.data_plane and s.dataplane is not None and not first.arrow_ipc:
                    await self._data_plane(context, up, s.dataplane)
                else:
                    await self._stream(context, up, first)
        finally:
            self.live.release(ident.robot_id, token)

    async def _stream(
        self, context: grpc.aio.ServicerContext, up: _Upload, msg: pb.StepBatch
    ) -> None:
        """Batches on this stream, split in parts under gRPC's message limit."""
        parts: list[bytes] = []
        while True:
            whole = await self._part(context, up, msg, parts)
            if whole is not None:
                await self._acks(context, up, whole)
            msg = await self._read(context)
            if msg is grpc.aio.EOF:
                return

    async def _part(
        self, context: grpc.aio.ServicerContext, up: _Upload, msg: pb.StepBatch, parts: list[bytes]
    ) -> bytes | None:
        """Collect one part of a batch sent on the stream; the whole batch after its last part."""
        if msg.run_id != up.run_id:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "one upload stream serves one run"
            )
        limit = self.s.settings.max_upload_batch_bytes
        parts.append(msg.arrow_ipc)
        if sum(len(p) for p in parts) > limit:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"step batch over {limit} bytes"
            )
        if msg.more:
            return None
        whole = parts[0] if len(parts) == 1 else b"".join(parts)
        parts.clear()
        return whole

    async def _data_plane(
        self, context: grpc.aio.ServicerContext, up: _Upload, dp: DataPlaneServer
    ) -> None:
        """Batches on the data plane (whole, zero-copy frames), acks on this stream.

        The data-plane thread puts each batch into the stream's mailbox; a worker stores
        what the mailbox holds, a round at a time, and hands the round's acks to this loop
        (``("acks", result)`` in ``events``, beside ``("grpc", message)`` from the stream)."""
        s = self.s
        events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def deliver(result: Any) -> None:
            loop.call_soon_threadsafe(events.put_nowait, ("acks", result))

        # A client keeps at most its window in flight; 4x leaves room for acks on the way.
        assert s.ingest_pool is not None  # set while the server serves
        box = Mailbox(up.take_all, deliver, s.ingest_pool, 4 * s.settings.upload_window)

        def on_batch(_seq: int, frame: Any) -> None:
            if not box.put(frame.buffer) and box.full:
                box.close()
                loop.call_soon_threadsafe(events.put_nowait, ("full", None))

        session = dp.open(on_batch)
        reader = asyncio.create_task(_pump(context, events))
        try:
            await write(
                s, context, pb.UploadAck(durable_seq=up.durable, data_plane=dp.offer(session))
            )
            await self._serve_events(context, up, box, events)
        finally:
            reader.cancel()
            box.close()
            dp.close_session(session)

    async def _serve_events(
        self,
        context: grpc.aio.ServicerContext,
        up: _Upload,
        box: Mailbox,
        events: asyncio.Queue[tuple[str, Any]],
    ) -> None:
        """Send each round's acks and take the stream's messages until the client closes it.
        A batch sent on the stream (a client that could not reach the data plane) goes
        through the mailbox too, so one worker at a time takes this stream's batches, in
        arrival order."""
        s = self.s
        parts: list[bytes] = []
        while True:
            try:
                kind, got = await asyncio.wait_for(events.get(), s.settings.stream_idle_timeout_s)
            except TimeoutError:
                await self._idle_abort(context)
            if kind == "bad":
                raise got
            if kind == "acks":
                if isinstance(got, Exception):
                    raise got  # a defect in the worker: logged and INTERNAL via ``guarded``
                acks, refused, rows = got
                await self._send_acks(context, up, acks, refused, rows, coalesce=True)
                continue
            if kind == "grpc":
                if got is grpc.aio.EOF:
                    return
                whole = await self._part(context, up, got, parts)
                if whole is None or box.put(whole):
                    continue
            # Here: "full" (the data-plane thread found the mailbox full) or a stream batch
            # the mailbox refused.
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "more step batches in flight than the upload window",
            )

    async def _acks(self, context: grpc.aio.ServicerContext, up: _Upload, batch: bytes) -> None:
        """Take one batch on the ingest pool and send its ack (then any refusal)."""
        pool = self.s.ingest_pool
        assert pool is not None  # set while the server serves
        loop = asyncio.get_running_loop()
        await self._send_acks(context, up, *await loop.run_in_executor(pool, up.take_all, [batch]))

    async def _send_acks(
        self,
        context: grpc.aio.ServicerContext,
        up: _Upload,
        acks: list[tuple[pb.UploadAck, bool]],
        refused: Exception | None,
        stored_rows: int,
        coalesce: bool = False,
    ) -> None:
        """Send the acks of one :meth:`_Upload.take_all` (then abort on its refusal);
        ``coalesce``: consecutive plain batch acks go as one (``UploadAck.batches``)."""
        self.s.uploaded_rows += stored_rows
        if stored_rows:
            by_run = self.s.uploaded_rows_by_run
            by_run[up.run_id] = by_run.get(up.run_id, 0) + stored_rows
        if stored_rows:
            await self.sink_full.stored(up.run_id)
        for ack in _coalesce(acks) if coalesce else [a for a, _ in acks]:
            await write(self.s, context, ack)
        if isinstance(refused, SinkFull):
            await self.sink_full.refused(up.run_id, str(refused))
        if refused is not None:
            await context.abort(_REFUSALS[type(refused)], str(refused))

    async def _read(self, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await asyncio.wait_for(
                read_message(context), self.s.settings.stream_idle_timeout_s
            )
        except TimeoutError:
            await self._idle_abort(context)

    async def _idle_abort(self, context: grpc.aio.ServicerContext) -> None:
        await context.abort(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"no step batch for {self.s.settings.stream_idle_timeout_s:.0f} s; stream dropped",
        )


def _ingest(
    data: Any,
    robot_id: int,
    run_id: str,
    durable: int,
    sink: StepSink | None,
    lock: threading.Lock,
) -> tuple[int, int]:
    """Validate a step batch and hand it to ``sink`` (None: validate only).

    Nothing is dropped here against a watermark: the sink stores the rows it does not hold and
    refuses, naming the seq, one below the robot's highest stored seq that it never stored, so
    an acknowledgement covers only rows the sink holds. Under the robot's lock the rows above
    the sink's durable seq before the call are exactly the ones it stored.

    Returns:
        (rows stored, durable seq afterwards).

    Raises:
        StepFormatError, ForeignRowsError, SinkRejected, SinkFull, SinkClosed, Backpressure.
    """
    batch = S.decode_batch(data, robot_id, run_id)
    if sink is None:
        return 0, durable
    with lock:
        before = sink.durable_seq(robot_id)
        after = sink.append(robot_id, batch)
    return int(np.count_nonzero(S.seq_numpy(batch) > before)), after


async def _pump(context: grpc.aio.ServicerContext, events: asyncio.Queue[tuple[str, Any]]) -> None:
    """Move this stream's messages (then EOF, or ("bad", BadRequest)) into ``events``."""
    while True:
        try:
            m = await read_message(context)
        except BadRequest as exc:
            events.put_nowait(("bad", exc))
            return
        events.put_nowait(("grpc", m))
        if m is grpc.aio.EOF:
            return
