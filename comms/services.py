"""The cloud's gRPC servicers (grpc.aio): enrollment, experience upload, weights, heartbeat,
control, remote inference.

Blocking work (database, sink appends with fsync, Arrow parsing, policy inference) runs in
worker threads so one slow robot never stalls the event loop. Streams have a per-message idle
timeout: a peer that neither sends nor reads for ``stream_idle_timeout_s`` is dropped and its
slot freed (HTTP/2 keepalive catches a peer that vanished outright).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import grpc.aio
import numpy as np
from sqlalchemy.exc import IntegrityError

from comms import steps as S
from comms import tensors as T
from comms import wire
from comms.auth import Authenticator, AuthError, RobotIdentity, credential_from
from comms.config import CommsSettings
from comms.dataplane import DataPlaneServer, Session
from comms.proto import robofleet_pb2 as pb
from comms.proto import robofleet_pb2_grpc as rpc
from comms.publisher import Published, WeightPublisher
from comms.ratelimit import AsyncByteRate
from comms.registry import record_heartbeat
from comms.sink import Backpressure, SinkRejected, SinkResolver, StepSink
from comms.weight_codec import EncodedVersion
from robofleet.store.store import EnrollmentError, MetadataStore

log = logging.getLogger(__name__)

# act(run_id, observation {name: array}, task) -> (action chunk (chunk, action_dim), policy_version)
ActHandler = Callable[[str, dict[str, np.ndarray], str], tuple[np.ndarray, int]]
R = TypeVar("R")


@dataclass
class ServerState:
    """What every servicer of one server shares."""

    settings: CommsSettings
    store: MetadataStore
    auth: Authenticator
    sinks: SinkResolver
    publishers: dict[str, WeightPublisher] = field(default_factory=dict)
    publishers_lock: threading.RLock = field(default_factory=threading.RLock)
    robot_locks: dict[tuple[str, int], threading.Lock] = field(default_factory=dict)
    act_handler: ActHandler | None = None
    loop: asyncio.AbstractEventLoop | None = None
    rate: AsyncByteRate = field(default_factory=lambda: AsyncByteRate(0))
    control: dict[int, asyncio.Queue[pb.ControlCommand]] = field(default_factory=dict)
    version_events: dict[str, asyncio.Event] = field(default_factory=dict)
    dataplane: DataPlaneServer | None = None
    active_streams: int = 0
    weight_bytes_sent: int = 0
    uploaded_rows: int = 0
    control_seq: int = 0

    def robot_lock(self, run_id: str, robot_id: int) -> threading.Lock:
        """Serializes one robot's appends to one run across its streams."""
        with self.publishers_lock:
            return self.robot_locks.setdefault((run_id, robot_id), threading.Lock())

    def publisher(self, run_id: str) -> WeightPublisher:
        # Called from the event loop (a subscriber) and from the learner's thread: without
        # the lock both could create one, and subscribers would wait on the lost one forever.
        with self.publishers_lock:
            pub = self.publishers.get(run_id)
            if pub is None:
                pub = WeightPublisher(
                    run_id,
                    self.settings.weight_chunk_bytes,
                    thread_nice=self.settings.weight_thread_nice,
                )
                self.attach(pub)
            return pub

    def attach(self, pub: WeightPublisher) -> None:
        """Serve ``pub``'s versions to subscribers of its run."""
        with self.publishers_lock:
            self.publishers[pub.run_id] = pub
        run_id = pub.run_id
        pub.add_listener(lambda _p: self._wake(run_id))

    def _wake(self, run_id: str) -> None:
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._set_event, run_id)

    def _set_event(self, run_id: str) -> None:
        ev = self.version_events.pop(run_id, None)
        if ev is not None:
            ev.set()

    def version_event(self, run_id: str) -> asyncio.Event:
        ev = self.version_events.get(run_id)
        if ev is None:
            ev = self.version_events[run_id] = asyncio.Event()
        return ev


def guarded[R](
    fn: Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[R]],
) -> Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[R]]:
    """Map refusals to status codes; an unexpected error is logged here, never sent as a traceback."""

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> R:
        try:
            return await fn(self, request, context)
        except AuthError as exc:
            code = (
                grpc.StatusCode.UNAUTHENTICATED
                if exc.unauthenticated
                else grpc.StatusCode.PERMISSION_DENIED
            )
            await context.abort(code, str(exc))
        except (grpc.aio.AbortError, asyncio.CancelledError):
            raise
        except Exception:
            log.exception("%s failed", fn.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, f"{fn.__name__}: internal error")
        raise AssertionError("unreachable")  # abort always raises

    return wrapper


async def identify(state: ServerState, context: grpc.aio.ServicerContext) -> RobotIdentity:
    cred = credential_from(context.invocation_metadata())
    return await asyncio.to_thread(state.auth.identify, cred)


async def write(state: ServerState, context: grpc.aio.ServicerContext, msg: Any) -> None:
    """Write with the idle timeout: a peer that stopped reading is dropped."""
    try:
        await asyncio.wait_for(context.write(msg), state.settings.stream_idle_timeout_s)
    except TimeoutError:
        await context.abort(
            grpc.StatusCode.DEADLINE_EXCEEDED, "peer stopped reading; stream dropped"
        )


class _Streams:
    """Counts open streams (for tests and /metrics)."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    def __enter__(self) -> None:
        self.state.active_streams += 1

    def __exit__(self, *exc: object) -> None:
        self.state.active_streams -= 1


class EnrollmentServicer(rpc.EnrollmentServicer):
    def __init__(self, state: ServerState) -> None:
        self.s = state

    @guarded
    async def Enroll(
        self, request: pb.EnrollRequest, context: grpc.aio.ServicerContext
    ) -> pb.EnrollReply:
        try:
            spec = json.loads(request.spec_json) if request.spec_json else {}
            if not isinstance(spec, dict):
                raise ValueError("not an object")
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"spec_json: {exc}")
        if not request.token:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "enrollment token is required")
        try:
            robot, credential = await asyncio.to_thread(
                self.s.store.consume_enrollment_token,
                request.token,
                robot_name=request.robot_name,
                robot_type=request.robot_type,
                spec=spec,
            )
        except EnrollmentError as exc:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
        except IntegrityError:
            await context.abort(
                grpc.StatusCode.ALREADY_EXISTS, f"a robot named {request.robot_name!r} exists"
            )
        return pb.EnrollReply(robot_id=robot.id, robot_name=robot.name, credential=credential)


_REFUSALS: dict[type[Exception], grpc.StatusCode] = {
    S.StepFormatError: grpc.StatusCode.INVALID_ARGUMENT,
    S.ForeignRowsError: grpc.StatusCode.PERMISSION_DENIED,
    SinkRejected: grpc.StatusCode.INVALID_ARGUMENT,
}


@dataclass
class _Upload:
    """One upload stream's position, used by one worker-thread hop at a time."""

    robot_id: int
    run_id: str
    sink: StepSink
    lock: threading.Lock
    durable: int
    resync: bool = False
    rows: int = 0

    def take(self, data: Any) -> pb.UploadAck:
        """Acknowledge one whole batch (empty: a hello / re-sync) after storing its new rows.

        After a refusal (backpressure) later batches are refused too, until the client
        re-syncs, so nothing is stored out of order around the refused batch.

        Raises:
            StepFormatError, ForeignRowsError, SinkRejected: the stream must be ended.
        """
        if not len(data):
            self.resync = False  # the client resends from ``durable``
            return pb.UploadAck(durable_seq=self.durable)
        ack = pb.UploadAck(durable_seq=self.durable)
        try:
            rows, self.durable = _ingest(
                data,
                self.robot_id,
                self.run_id,
                self.durable,
                None if self.resync else self.sink,
                self.lock,
            )
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
    ) -> tuple[list[tuple[pb.UploadAck, bool]], Exception | None]:
        """:meth:`take` for several batches in one hop; stops at the first refusal.

        Returns:
            ([(ack, whether it is a plain batch ack: stored, no backpressure)], the refusal).
        """
        acks: list[tuple[pb.UploadAck, bool]] = []
        for data in batches:
            try:
                ack = self.take(data)
            except tuple(_REFUSALS) as exc:
                return acks, exc
            acks.append((ack, len(data) > 0 and not ack.backpressure))
        return acks, None


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


class ExperienceServicer(rpc.ExperienceServicer):
    def __init__(self, state: ServerState) -> None:
        self.s = state

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
        run_id = first.run_id
        await asyncio.to_thread(s.auth.require_lease, ident, run_id)
        sink = s.sinks(run_id)
        if sink is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown run {run_id!r}")
        assert sink is not None
        durable = await asyncio.to_thread(sink.durable_seq, ident.robot_id)
        up = _Upload(ident.robot_id, run_id, sink, s.robot_lock(run_id, ident.robot_id), durable)
        with _Streams(s):
            if first.data_plane and s.dataplane is not None and not first.arrow_ipc:
                await self._data_plane(context, up, s.dataplane)
            else:
                await self._stream(context, up, first)

    async def _stream(
        self, context: grpc.aio.ServicerContext, up: _Upload, msg: pb.StepBatch
    ) -> None:
        """Batches on this stream, split in parts under gRPC's message limit."""
        parts: list[bytes] = []
        while True:
            whole = await self._part(context, up, msg, parts)
            if whole is not None:
                await self._acks(context, up, [whole])
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
        """Batches on the data plane (whole, zero-copy frames), acks on this stream. Batches
        that arrived together are taken in one worker-thread hop."""
        s = self.s
        # Both sources feed one queue in arrival order: ("dp", frame) from the data-plane
        # thread, ("grpc", message or EOF) from this stream.
        inbox: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        session = dp.open(
            lambda _seq, frame: loop.call_soon_threadsafe(inbox.put_nowait, ("dp", frame))
        )

        async def pump() -> None:
            while True:
                m = await context.read()
                inbox.put_nowait(("grpc", m))
                if m is grpc.aio.EOF:
                    return

        reader = asyncio.create_task(pump())
        parts: list[bytes] = []
        limit = 4 * s.settings.upload_window  # a client keeps at most its window in flight
        try:
            await write(
                s, context, pb.UploadAck(durable_seq=up.durable, data_plane=dp.offer(session))
            )
            carry: tuple[str, Any] | None = None  # taken while gathering batches
            while True:
                if carry is not None:
                    (kind, got), carry = carry, None
                else:
                    try:
                        kind, got = await asyncio.wait_for(
                            inbox.get(), s.settings.stream_idle_timeout_s
                        )
                    except TimeoutError:
                        await self._idle_abort(context)
                if kind == "grpc":
                    if got is grpc.aio.EOF:
                        return
                    # A client that could not reach the data plane sends on this stream.
                    whole = await self._part(context, up, got, parts)
                    if whole is not None:
                        await self._acks(context, up, [whole])
                    continue
                if inbox.qsize() > limit:
                    await context.abort(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        "more step batches in flight than the upload window",
                    )
                batches = [got.buffer]
                while not inbox.empty():
                    item = inbox.get_nowait()
                    if item[0] != "dp":
                        carry = item
                        break
                    batches.append(item[1].buffer)
                if any(len(b) > s.settings.max_upload_batch_bytes for b in batches):
                    await context.abort(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"step batch over {s.settings.max_upload_batch_bytes} bytes",
                    )
                await self._acks(context, up, batches, coalesce=True)
        finally:
            reader.cancel()
            dp.close_session(session)

    async def _acks(
        self,
        context: grpc.aio.ServicerContext,
        up: _Upload,
        batches: list[Any],
        coalesce: bool = False,
    ) -> None:
        """Take ``batches`` in one worker-thread hop and send their acks (then any refusal);
        ``coalesce``: consecutive plain batch acks go as one (``UploadAck.batches``)."""
        before = up.rows
        acks, refused = await asyncio.to_thread(up.take_all, batches)
        self.s.uploaded_rows += up.rows - before
        for ack in _coalesce(acks) if coalesce else [a for a, _ in acks]:
            await write(self.s, context, ack)
        if refused is not None:
            await context.abort(_REFUSALS[type(refused)], str(refused))

    async def _read(self, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await asyncio.wait_for(context.read(), self.s.settings.stream_idle_timeout_s)
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
    """Validate a step batch and append its new rows to ``sink`` (None: validate only).

    The rows already durable are dropped against the sink itself, under the robot's lock: a
    robot whose old stream is still draining (a reconnect through a relay or a slow link) may
    have two streams at once, and each stream's own view of ``durable`` would store rows twice.

    Returns:
        (rows appended, durable seq afterwards).

    Raises:
        StepFormatError, ForeignRowsError, SinkRejected, Backpressure.
    """
    batch = S.decode_batch(data, robot_id, run_id)
    if sink is None:
        return 0, durable
    with lock:
        durable = max(durable, sink.durable_seq(robot_id))
        batch = S.drop_acknowledged(batch, durable)
        if not batch.num_rows:
            return 0, durable
        return batch.num_rows, sink.append(robot_id, batch)


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
            # Pre-serialized (see comms.wire): one copy per chunk and subscriber.
            await write(s, context, enc.chunk_wire(i))
            s.weight_bytes_sent += n

    async def _authorize(self, context: grpc.aio.ServicerContext, run_id: str) -> WeightPublisher:
        ident = await identify(self.s, context)
        await asyncio.to_thread(self.s.auth.require_lease, ident, run_id)
        return self.s.publisher(run_id)

    @guarded
    async def Subscribe(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        """Latest-only with a window of one version per subscriber.

        The first request names the run and the version held; the newest version is sent, then
        nothing more until the subscriber acknowledges it (``done_version``), after which the
        newest at that moment follows, as a delta onto the acknowledged ``have_version`` when
        the publisher still holds that base. Versions published meanwhile are never queued, so
        a slow robot skips them and the server holds nothing per subscriber but the encoding
        being sent. The call ends when the subscriber closes its side.
        """
        first = await context.read()
        if first is grpc.aio.EOF:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "Subscribe needs a first request naming the run"
            )
        pub = await self._authorize(context, first.run_id)
        have = int(first.have_version)
        done = have
        acked = asyncio.Event()
        acked.set()
        closed = False
        dp = self.s.dataplane
        session = dp.open() if dp is not None and first.data_plane else None

        async def read_acks() -> None:
            nonlocal have, done, closed
            async for ack in request_iterator:
                have, done = int(ack.have_version), max(done, int(ack.done_version))
                if ack.data_plane_failed and session is not None and dp is not None:
                    dp.unbind(session)  # chunks go on this stream from now on
                acked.set()
            closed = True
            acked.set()

        reader = asyncio.create_task(read_acks())
        try:
            if session is not None:
                assert dp is not None
                await write(self.s, context, pb.WeightMessage(data_plane=dp.offer(session)))
                # Give the subscriber its handshake time, so a version waiting already (a late
                # joiner, a big model) goes on the data plane too; a robot that cannot reach it
                # gets its first version that much later, on this stream.
                deadline = time.monotonic() + self.s.settings.data_plane_handshake_s
                while not session.bound.is_set() and not closed and time.monotonic() < deadline:
                    await asyncio.sleep(0.005)
            with _Streams(self.s):
                while True:
                    await acked.wait()
                    if closed:
                        return
                    pub = self.s.publisher(pub.run_id)  # a publisher attached after a restart
                    floor = max(have, done)
                    latest: Published | None = pub.latest()
                    if latest is None or latest.version <= floor:
                        ev = self.s.version_event(pub.run_id)
                        latest = pub.latest()
                        if latest is None or latest.version <= floor:
                            try:
                                await asyncio.wait_for(ev.wait(), self.s.settings.keepalive_time_s)
                            except TimeoutError:
                                pass
                            continue
                    enc = latest.for_subscriber(have)
                    acked.clear()
                    await self._send(context, enc, None, session)
        finally:
            reader.cancel()
            if session is not None and dp is not None:
                dp.close_session(session)

    @guarded
    async def Fetch(self, request: pb.FetchRequest, context: grpc.aio.ServicerContext) -> None:
        pub = await self._authorize(context, request.run_id)
        latest = pub.latest()
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
        with _Streams(self.s):
            await self._send(context, enc, list(request.indices) or None)


class HeartbeatServicer(rpc.HeartbeatServicer):
    def __init__(self, state: ServerState) -> None:
        self.s = state

    @guarded
    async def Beat(
        self, request: pb.HeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> pb.HeartbeatReply:
        ident = await identify(self.s, context)
        applied = (
            None if request.applied_policy_version < 0 else int(request.applied_policy_version)
        )
        await asyncio.to_thread(
            record_heartbeat,
            self.s.store,
            ident.robot_id,
            request.state,
            applied,
            dict(request.stats),
        )
        return pb.HeartbeatReply(server_time=time.time())


class ControlServicer(rpc.ControlServicer):
    def __init__(self, state: ServerState) -> None:
        self.s = state

    @guarded
    async def Commands(self, request: pb.ControlRequest, context: grpc.aio.ServicerContext) -> None:
        ident = await identify(self.s, context)
        q: asyncio.Queue[pb.ControlCommand] = asyncio.Queue(maxsize=64)
        self.s.control[ident.robot_id] = q  # a reconnecting robot replaces its old stream
        try:
            with _Streams(self.s):
                while True:
                    cmd = await q.get()
                    await write(self.s, context, cmd)
        finally:
            if self.s.control.get(ident.robot_id) is q:
                del self.s.control[ident.robot_id]


class ActServicer(rpc.ActServicer):
    def __init__(self, state: ServerState) -> None:
        self.s = state

    @guarded
    async def Act(self, request: pb.ActRequest, context: grpc.aio.ServicerContext) -> pb.ActReply:
        ident = await identify(self.s, context)
        await asyncio.to_thread(self.s.auth.require_lease, ident, request.run_id)
        handler = self.s.act_handler
        if handler is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this server runs no remote policy")
        assert handler is not None
        try:
            obs = {k: tensor_from_proto(v) for k, v in request.observation.items()}
        except (T.TensorFormatError, KeyError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"observation: {exc}")
        remaining = context.time_remaining()
        try:
            action, version = await asyncio.wait_for(
                asyncio.to_thread(handler, request.run_id, obs, request.task), remaining
            )
        except TimeoutError:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "policy did not answer in time")
        return pb.ActReply(action=tensor_to_proto(action), policy_version=version)


def tensor_to_proto(value: Any) -> pb.Tensor:
    arr, dtype = T.as_array(value)
    return pb.Tensor(dtype=dtype, shape=list(arr.shape), data=arr.tobytes())


def tensor_from_proto(t: pb.Tensor) -> np.ndarray:
    """Raises TensorFormatError when dtype, shape and byte count disagree."""
    if t.dtype not in T.DTYPES:
        raise T.TensorFormatError(f"unknown dtype {t.dtype!r}")
    dt = T.DTYPES[t.dtype]
    n = int(np.prod(list(t.shape), dtype=np.int64)) if t.shape else 1
    if any(s < 0 for s in t.shape) or n * dt.itemsize != len(t.data):
        raise T.TensorFormatError(f"{len(t.data)} bytes do not hold {t.dtype}{list(t.shape)}")
    return np.frombuffer(t.data, dtype=dt).reshape(tuple(t.shape))


def add_servicers(server: grpc.aio.Server, state: ServerState) -> None:
    rpc.add_EnrollmentServicer_to_server(EnrollmentServicer(state), server)
    rpc.add_ExperienceServicer_to_server(ExperienceServicer(state), server)
    add_weights_servicer(server, WeightsServicer(state))
    rpc.add_HeartbeatServicer_to_server(HeartbeatServicer(state), server)
    rpc.add_ControlServicer_to_server(ControlServicer(state), server)
    rpc.add_ActServicer_to_server(ActServicer(state), server)


def add_weights_servicer(server: grpc.aio.Server, servicer: rpc.WeightsServicer) -> None:
    """Register the Weights service with a serializer that passes pre-serialized chunks on."""
    handlers = {
        "Subscribe": grpc.stream_stream_rpc_method_handler(
            servicer.Subscribe,
            request_deserializer=pb.SubscribeRequest.FromString,
            response_serializer=wire.passthrough,
        ),
        "Fetch": grpc.unary_stream_rpc_method_handler(
            servicer.Fetch,
            request_deserializer=pb.FetchRequest.FromString,
            response_serializer=wire.passthrough,
        ),
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("robofleet.comms.v1.Weights", handlers),)
    )


def server_options(settings: CommsSettings) -> list[tuple[str, Any]]:
    """Keepalive (detects vanished peers) and message limits shared by cloud and relay."""
    ka_ms = int(settings.keepalive_time_s * 1000)
    return [
        ("grpc.keepalive_time_ms", ka_ms),
        ("grpc.keepalive_timeout_ms", int(settings.keepalive_timeout_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", max(100, ka_ms // 2)),
        ("grpc.http2.max_ping_strikes", 0),
        ("grpc.max_receive_message_length", 8 * 1024 * 1024),
        ("grpc.max_send_message_length", 8 * 1024 * 1024),
        ("grpc.so_reuseport", 0),
    ]


def control_command(
    state: ServerState, kind: Any, run_id: str = "", reason: str = ""
) -> pb.ControlCommand:
    state.control_seq += 1
    return pb.ControlCommand(kind=kind, run_id=run_id, reason=reason, seq=state.control_seq)
