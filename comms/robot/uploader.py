"""Experience upload from a robot: spool, stream, acknowledge, resume.

Every step batch goes into a :class:`Spool` first; the :class:`Uploader` streams what the cloud
has not acknowledged, drops batches once an ack reports them durable, and on any failure
reconnects (exponential backoff with jitter) and asks the cloud for its durable ``seq`` before
resending, so a cloud restart causes neither loss nor duplicates. Backpressure pauses sending
for the time the cloud asks.

With ``comms.data_plane`` on, the opening message asks for the server's ZeroMQ data plane
(:mod:`comms.cloud.dataplane`); when one is offered and answers, the batches (whole, zero-copy from
the spool) and re-sync hellos go there and the acks keep coming on the gRPC stream, with the
same window, backpressure and re-sync rules. When it does not answer, the batches go on the
stream as before. A data plane that stops delivering shows as missing acks: the stream is
dropped after ``stream_idle_timeout_s`` and re-opened (and re-synced).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import grpc
import pyarrow as pa
import zmq

from comms.proto import robofleet_pb2 as pb
from comms.robot import dataplane_client
from comms.robot.client import FATAL_CODES, EdgeClient
from comms.robot.shard_route import ShardRouter
from comms.wire import payload_messages
from comms.wire import steps as S
from comms.wire.dataplane_frames import BATCH, BATCH_HEADER
from comms.wire.steps import NO_SEQ
from foundation.retry import Backoff

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SpoolEntry:
    """One step batch waiting for its acknowledgement (Arrow IPC bytes, highest seq)."""

    last_seq: int
    data: bytes


class Spool(Protocol):
    """Unacknowledged step batches of one robot, ``last_seq`` increasing. The edge agent may
    provide a disk-backed one; :class:`MemorySpool` is the in-memory version."""

    def entries_after(self, seq: int, limit: int) -> list[SpoolEntry]:
        """Up to ``limit`` entries with ``last_seq > seq``, oldest first."""
        ...

    def ack(self, durable_seq: int) -> None:
        """Drop entries with ``last_seq <= durable_seq``."""
        ...

    def wait(self, after_seq: int, timeout: float) -> bool:
        """Block until an entry with ``last_seq > after_seq`` exists; returns whether one does."""
        ...


class MemorySpool:
    """In-memory :class:`Spool` (thread-safe)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._entries: collections.deque[SpoolEntry] = collections.deque()
        self.durable_seq = NO_SEQ

    def put(self, batch: pa.RecordBatch) -> int:
        """Spool ``batch``; returns its highest seq.

        Raises:
            StepFormatError: the batch is not valid (see :func:`comms.wire.steps.decode_batch`) or
                its seqs do not follow the spooled ones.
        """
        data = S.encode_batch(batch)
        checked = S.decode_batch(data)
        first, last = int(checked.column("seq")[0].as_py()), S.last_seq(checked)
        with self._cond:
            tail = self._entries[-1].last_seq if self._entries else self.durable_seq
            if first <= tail:
                raise S.StepFormatError(f"seq {first} does not follow the spooled seq {tail}")
            self._entries.append(SpoolEntry(last, data))
            self._cond.notify_all()
        return last

    def entries_after(self, seq: int, limit: int) -> list[SpoolEntry]:
        with self._cond:
            out: list[SpoolEntry] = []
            for e in self._entries:
                if e.last_seq > seq:
                    out.append(e)
                    if len(out) >= limit:
                        break
            return out

    def ack(self, durable_seq: int) -> None:
        with self._cond:
            self.durable_seq = max(self.durable_seq, durable_seq)
            while self._entries and self._entries[0].last_seq <= durable_seq:
                self._entries.popleft()
            self._cond.notify_all()

    def wait(self, after_seq: int, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(
                lambda: bool(self._entries) and self._entries[-1].last_seq > after_seq, timeout
            )

    def __len__(self) -> int:
        with self._cond:
            return len(self._entries)

    def wait_acked(self, seq: int, timeout: float) -> bool:
        """Block until ``seq`` is acknowledged durable; returns whether it was in time."""
        with self._cond:
            return self._cond.wait_for(lambda: self.durable_seq >= seq, timeout)


_HELLO = -2  # marker in the outstanding-ack queue
_Request = (
    pb.StepBatch | bytes
)  # a message, or one already serialized (``payload_messages.step_batch``)


class Uploader:
    """Streams a robot's spool to the cloud on a background thread.

    Args:
        client: the robot's :class:`EdgeClient` (cloud or site relay).
        run_id: the run the steps belong to (the robot must hold a lease on it).
        spool: where batches wait for their acknowledgement.
        router: where each stream goes (a sharded run's shard endpoint); None: the cloud.

    Attributes:
        durable_seq: highest seq the cloud acknowledged as durable.
        last_error: the last stream error (code and details), for status displays.
        reconnects: how many times the stream was re-opened.
    """

    def __init__(
        self, client: EdgeClient, run_id: str, spool: Spool, router: ShardRouter | None = None
    ) -> None:
        self._client = client
        self._router = router
        self._run_id = run_id
        self._spool = spool
        self._s = client.settings
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self.durable_seq = NO_SEQ
        self.last_error: str | None = None
        self.reconnects = 0
        self.backpressured = 0
        self.data_plane_batches = 0  # batches sent on the ZeroMQ data plane
        self._call: Any = None
        self._thread = threading.Thread(target=self._run, name=f"uploader-{run_id}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        call = self._call
        if call is not None:
            call.cancel()
        self._thread.join(timeout=10)
        if self._router is not None:
            self._router.close()

    def _run(self) -> None:
        backoff = Backoff(self._s.reconnect_initial_s, self._s.reconnect_max_s)
        while not self._stop.is_set():
            progressed = False
            to_shard = False
            try:
                upload, metadata, to_shard = self._target()
                progressed = self._stream_once(upload, metadata, self._dialed(to_shard))
                if to_shard:
                    self._note_shard_end(None)
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                self.last_error = f"{code}: {exc.details() if hasattr(exc, 'details') else exc}"
                if to_shard:
                    # The shard was away, moved, or refused its ticket: the cloud is asked
                    # for the route before the next stream. A refusal of the steps
                    # themselves (invalid, not the robot's) is as loud as the cloud's.
                    self._note_shard_end(code)
                    loud = code in FATAL_CODES and code != grpc.StatusCode.UNAUTHENTICATED
                    log.log(
                        logging.ERROR if loud else logging.INFO,
                        "upload stream to the shard ended (%s); asking the cloud again",
                        self.last_error,
                    )
                elif code in FATAL_CODES:
                    log.error("upload refused (%s); retrying slowly", self.last_error)
                elif code == grpc.StatusCode.ALREADY_EXISTS:  # another stream of this robot
                    log.warning("upload refused (%s); retrying", self.last_error)
                else:
                    log.info("upload stream lost (%s); reconnecting", code)
            if self._stop.is_set():
                return
            if progressed:
                backoff.reset()
            self.reconnects += 1
            if backoff.sleep(self._stop):
                return

    def _target(self) -> tuple[Any, Any, bool]:
        """(upload call, metadata, whether to a shard) of the next stream.

        Raises:
            grpc.RpcError: the router could not learn a route.
        """
        if self._router is None:
            return self._client.upload_stream, self._client.metadata, False
        return self._router.target()

    def _dialed(self, to_shard: bool) -> str | None:
        """The ``host:port`` the next stream dials (a shard's route, else the client's)."""
        route = self._router.route if to_shard and self._router is not None else None
        return route.address if route is not None else self._client.address

    def _note_shard_end(self, code: grpc.StatusCode | None) -> None:
        assert self._router is not None
        self._router.stream_ended(code)

    def _stream_once(self, upload: Any, metadata: Any, dialed: str | None) -> bool:
        """One stream's life (to ``dialed``). Returns whether it got any acknowledgement."""
        st = _StreamState()
        st.dialed = dialed
        call = upload(self._requests(st), metadata=metadata)
        self._call = call
        got_ack = False
        try:
            for ack in call:
                got_ack = True
                self._on_ack(st, ack)
        finally:
            with self._cond:
                st.dead = True
                self._cond.notify_all()
            call.cancel()
        return got_ack

    def _on_ack(self, st: _StreamState, ack: pb.UploadAck) -> None:
        with self._cond:
            st.last_progress = time.monotonic()
            kind = st.pop_outstanding()
            for _ in range(int(ack.batches) - 1):  # one ack for several batches (data plane)
                if st.outstanding:
                    kind = st.pop_outstanding()
            if ack.durable_seq > self.durable_seq:
                self.durable_seq = int(ack.durable_seq)
            if ack.HasField("data_plane") and st.offer is None:
                st.offer = ack.data_plane
            if kind == _HELLO:
                st.synced = True
                st.sent_seq = int(ack.durable_seq)
            elif ack.backpressure and not st.need_sync:
                self.backpressured += 1
                st.need_sync = True
                st.resync_at = time.monotonic() + ack.retry_after_ms / 1000
            self._cond.notify_all()
        self._spool.ack(int(ack.durable_seq))

    def _requests(self, st: _StreamState) -> Any:
        """Request generator (runs on a gRPC thread, which also owns the data-plane socket)."""
        try:
            yield from self._request_loop(st)
        finally:
            if st.sock is not None:
                st.sock.close(0)
                st.sock = None

    def _request_loop(self, st: _StreamState) -> Iterator[_Request]:
        """The opening message, then hellos and batches as the window, backpressure and
        re-sync rules allow, until the stream dies, the uploader stops or a send fails."""
        with self._cond:
            st.outstanding.append(_HELLO)
        yield pb.StepBatch(run_id=self._run_id, data_plane=self._s.data_plane)
        while True:
            turn = self._next_turn(st)
            if turn is None:
                return
            self._open_data_plane(st)
            if turn.hello:
                if not (yield from self._send_hello(st)):
                    return
                continue
            if not turn.ready:
                with self._cond:
                    self._cond.wait(0.2)
                continue
            entries = self._spool.entries_after(turn.sent_seq, turn.room)
            if not entries:
                self._spool.wait(turn.sent_seq, 0.2)
                continue
            if not (yield from self._send_entries(st, entries)):
                return

    def _next_turn(self, st: _StreamState) -> _Turn | None:
        """What the request loop does next, once any backpressure pause is over; None when
        the stream is to end (stopped, dead, or no ack for ``stream_idle_timeout_s``: then
        it is dropped). A due re-sync queues its hello here."""
        s = self._s
        with self._cond:
            while True:
                if self._stop.is_set() or st.dead:
                    return None
                now = time.monotonic()
                inflight = sum(1 for k in st.outstanding if k != _HELLO)
                if st.outstanding and now - st.last_progress > s.stream_idle_timeout_s:
                    log.warning("no ack for %.0f s; dropping the stream", s.stream_idle_timeout_s)
                    self._drop_stream()
                    return None
                if not st.need_sync:
                    hello = False
                    break
                if now >= st.resync_at:
                    st.need_sync = False
                    st.synced = False
                    st.outstanding.append(_HELLO)
                    hello = True
                    break
                self._cond.wait(min(0.5, st.resync_at - now))
            room = s.upload_window - inflight
            ready = st.synced and room > 0 and st.inflight_bytes < s.upload_window_bytes
            return _Turn(hello, ready, st.sent_seq, room)

    def _open_data_plane(self, st: _StreamState) -> None:
        """Connect to the data plane the first ack offered, once a stream (``st.sock`` stays
        None when it does not answer: the batches go on the stream)."""
        if st.offer is not None and not st.tried:
            st.tried = True
            st.sock = dataplane_client.connect(
                st.offer,
                self._s.data_plane_handshake_s,
                require_curve=self._s.tls_ca_file is not None,
                dialed=st.dialed,
            )

    def _send_hello(self, st: _StreamState) -> Generator[_Request, None, bool]:
        """A re-sync hello, on the data plane when there is one; False when it could not be
        sent (the stream is dropped)."""
        if st.sock is not None:
            return self._send_frames(st, [BATCH, BATCH_HEADER.pack(-1, 0), b""])
        yield pb.StepBatch(run_id=self._run_id)
        return True

    def _send_entries(
        self, st: _StreamState, entries: list[SpoolEntry]
    ) -> Generator[_Request, None, bool]:
        """Send ``entries`` in order, each counted outstanding first, until a re-sync is due
        or the stream ends; False when the data plane could not take one (the stream is
        dropped)."""
        for e in entries:
            with self._cond:
                if st.need_sync or st.dead or self._stop.is_set():
                    break
                if st.inflight_bytes >= self._s.upload_window_bytes:
                    break  # the byte window is full: an ack makes room
                st.outstanding.append(e.last_seq)
                st.outstanding_bytes.append(len(e.data))
                st.inflight_bytes += len(e.data)
                st.sent_seq = e.last_seq
                if len(st.outstanding) == 1:
                    st.last_progress = time.monotonic()
            if st.sock is not None:
                # Whole, and without a copy: the frame points at the spooled bytes.
                head = BATCH_HEADER.pack(e.last_seq, 0)
                if not self._send_frames(st, [BATCH, head, e.data]):
                    return False
                self.data_plane_batches += 1
            else:
                yield from _parts(self._run_id, e, self._s.upload_part_bytes)
        return True

    def _drop_stream(self) -> None:
        """Cancel the stream's call: its ack loop ends and :meth:`_run` re-opens it."""
        if self._call is not None:
            self._call.cancel()

    def _send_frames(self, st: _StreamState, frames: list[bytes]) -> bool:
        """Send on the data plane; False (and the stream is dropped) when it cannot take it."""
        assert st.sock is not None
        try:
            st.sock.send_multipart(frames, copy=False)
            return True
        except zmq.ZMQError as exc:
            self.last_error = f"data plane: {exc}"
            log.info("data plane send failed (%s); re-opening the stream", exc)
            self._drop_stream()
            return False

    def wait_durable(self, seq: int, timeout: float) -> bool:
        """Block until the cloud acknowledged ``seq`` as durable."""
        deadline = time.monotonic() + timeout
        with self._cond:
            return self._cond.wait_for(
                lambda: self.durable_seq >= seq, max(0.0, deadline - time.monotonic())
            )


class _Turn(NamedTuple):
    """The request loop's next move: send a re-sync hello, or send up to ``room`` batches
    after ``sent_seq`` when ``ready`` (synced and the window not full)."""

    hello: bool
    ready: bool
    sent_seq: int
    room: int


class _StreamState:
    def __init__(self) -> None:
        self.outstanding: collections.deque[int] = collections.deque()
        self.outstanding_bytes: collections.deque[int] = collections.deque()  # per batch sent
        self.inflight_bytes = 0  # of the batches sent and not acknowledged
        self.synced = False
        self.sent_seq = NO_SEQ
        self.need_sync = False
        self.resync_at = 0.0
        self.dead = False
        self.last_progress = time.monotonic()
        self.offer: pb.DataPlane | None = None  # from the first ack
        self.tried = False
        self.dialed: str | None = None  # the stream's gRPC target: a wildcard offer's host
        self.sock: zmq.Socket[bytes] | None = None  # owned by the request generator

    def pop_outstanding(self) -> int:
        """The oldest outstanding send (a batch's seq, or ``_HELLO``), now acknowledged."""
        if not self.outstanding:
            return _HELLO
        kind = self.outstanding.popleft()
        if kind != _HELLO:
            self.inflight_bytes -= self.outstanding_bytes.popleft()
        return kind


def _parts(run_id: str, e: SpoolEntry, part_bytes: int) -> Any:
    """A batch as serialized ``StepBatch`` messages under gRPC's 4 MB limit (``more`` on all
    but the last)."""
    n = len(e.data)
    mv = memoryview(e.data)
    for off in range(0, n, part_bytes):
        yield payload_messages.step_batch(
            run_id, e.last_seq, mv[off : off + part_bytes], off + part_bytes < n
        )
