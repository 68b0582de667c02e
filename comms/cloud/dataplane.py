"""The server side of the ZeroMQ data plane: bulk bytes beside gRPC, gRPC stays the control.

Python gRPC costs about as much per MiB as the work it carries (every message is copied into
and out of Python objects under the GIL); ZeroMQ moves multipart frames without that, and a
frame can point into a buffer the server already holds. So a gRPC stream that is authenticated
(credential, lease) asks for a data plane and gets an offer (``pb.DataPlane``): an endpoint and
a single-use 32-byte token. The client connects a DEALER socket to our ROUTER and sends
``[b"hi", token]``; the server binds that ZeroMQ peer to the gRPC stream and answers
``[b"ok"]``. Everything else stays on gRPC: manifests, acknowledgements, errors.

- Weights: chunks of a version go out as ``[b"w", header, data]`` frames that point into the
  version's shared, read-only payload (made once per version and sent to every subscriber: no
  per-subscriber copy or frame); the subscriber still checks each chunk's digest against the
  manifest it got over gRPC.
- Experience: the robot sends ``[b"b", header, arrow_ipc]`` per step batch (whole, no 4 MB
  split); a handler of the gRPC stream ingests it and the acknowledgement goes back on gRPC.

Security: the token is only ever sent over the authenticated (and, with TLS, encrypted) gRPC
stream and dies with it; a peer that did not present a live token gets nothing and its frames
are dropped. When the gRPC server uses TLS the ROUTER is a CURVE server (encrypted, key sent
over the TLS stream); where libzmq lacks CURVE no data plane is offered (gRPC bytes).

Sockets are used by one thread only (``dataplane`` thread); other threads hand work to it
through a queue and an ``inproc`` wake-up socket.
"""

from __future__ import annotations

import logging
import os
import queue
import struct
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq

from comms.proto import robofleet_pb2 as pb
from comms.wire.dataplane_frames import BATCH, BATCH_HEADER, CHUNK_HEADER, HELLO, NO, OK, WEIGHT
from comms.wire.weight_codec import EncodedVersion

log = logging.getLogger(__name__)

_SEND_SLICE = 16  # chunks sent to one subscriber before the next gets a turn


def curve_available() -> bool:
    """Whether this libzmq can encrypt (CURVE)."""
    return bool(zmq.has("curve"))


@dataclass(eq=False)
class Session:
    """One gRPC stream's use of the data plane.

    ``peer`` is the ZeroMQ routing id once the client said hello; ``on_batch`` (experience
    sessions) is called on the data-plane thread with ``(last_seq, frame)`` for each batch.
    """

    token: bytes
    on_batch: Callable[[int, zmq.Frame], object] | None = None
    peer: bytes | None = None
    closed: bool = False
    bound: threading.Event = field(default_factory=threading.Event)


@dataclass(eq=False)
class _Job:
    session: Session
    enc: EncodedVersion
    todo: deque[int]


class DataPlaneServer:
    """A ROUTER socket on ``host:port`` serving the sessions of one gRPC server.

    Args:
        host: address to bind (loopback by default, as the gRPC server).
        port: 0 = any free port.
        advertise_host: host written into offers (default ``host``).
        curve: encrypt with CURVE (required when the gRPC side uses TLS).
        max_bytes_per_s: cap on weight bytes sent to all subscribers (0 = none).
        max_message_bytes: larger inbound messages make libzmq drop the peer.

    Raises:
        RuntimeError: ``curve`` asked for but libzmq has no CURVE; the port cannot be bound.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        advertise_host: str | None = None,
        curve: bool = False,
        max_bytes_per_s: float = 0.0,
        max_message_bytes: int = 256 * 1024 * 1024,
    ) -> None:
        if curve and not curve_available():
            raise RuntimeError("libzmq has no CURVE support; cannot encrypt the data plane")
        self._ctx = zmq.Context(io_threads=2)
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a full peer queue raises, never drops
        self._sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes + 4096)
        self.curve_public_key = b""
        if curve:
            public, secret = zmq.curve_keypair()
            self._sock.setsockopt(zmq.CURVE_SERVER, 1)
            self._sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
            self.curve_public_key = public
        try:
            if port:
                self._sock.bind(f"tcp://{host}:{port}")
                self.port = port
            else:
                self.port = self._sock.bind_to_random_port(f"tcp://{host}")
        except zmq.ZMQError as exc:
            self._sock.close(0)
            self._ctx.term()
            raise RuntimeError(f"cannot bind the data plane to {host}:{port}: {exc}") from exc
        self.endpoint = f"tcp://{advertise_host or host}:{self.port}"
        self._wake_addr = f"inproc://dataplane-wake-{id(self)}"
        self._wake_rx = self._ctx.socket(zmq.PULL)
        self._wake_rx.bind(self._wake_addr)
        self._wake_tx = self._ctx.socket(zmq.PUSH)
        self._wake_tx.setsockopt(zmq.LINGER, 0)
        self._wake_tx.connect(self._wake_addr)
        self._wake_lock = threading.Lock()
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._sessions: dict[bytes, Session] = {}
        self._by_peer: dict[bytes, Session] = {}
        self._lock = threading.Lock()
        self._jobs: deque[_Job] = deque()
        self._frames: dict[int, list[tuple[zmq.Frame, zmq.Frame]]] = {}  # id(enc) -> frames
        self._max_bps = max_bytes_per_s
        self._next_send = time.monotonic()
        self._stop = False
        self.weight_bytes_sent = 0
        self.batches_received = 0
        self.frames_refused = 0  # from peers without a live session, or malformed
        self._thread = threading.Thread(target=self._run, name="dataplane", daemon=True)
        self._thread.start()

    # -- any thread -------------------------------------------------------------------------

    def open(self, on_batch: Callable[[int, zmq.Frame], object] | None = None) -> Session:
        """A new session with a fresh token (offer it with :meth:`offer`)."""
        s = Session(os.urandom(32), on_batch)
        with self._lock:
            self._sessions[s.token] = s
        return s

    @property
    def open_sessions(self) -> int:
        """Sessions whose gRPC stream is still open."""
        with self._lock:
            return len(self._sessions)

    def offer(self, session: Session) -> pb.DataPlane:
        return pb.DataPlane(
            endpoint=self.endpoint, token=session.token, curve_server_key=self.curve_public_key
        )

    def close_session(self, session: Session) -> None:
        """Forget ``session`` (its gRPC stream ended); pending chunks to it are dropped."""
        session.closed = True
        with self._lock:
            self._sessions.pop(session.token, None)
            if session.peer is not None and self._by_peer.get(session.peer) is session:
                del self._by_peer[session.peer]
        self._post(("close", session))

    def unbind(self, session: Session) -> None:
        """Stop using the data plane for ``session`` (the client said it gets nothing there)."""
        session.bound.clear()
        self._post(("close", session))

    def send_version(self, session: Session, enc: EncodedVersion, indices: list[int]) -> None:
        """Queue chunks ``indices`` of ``enc`` to the session's peer (returns at once)."""
        self._post(("send", _Job(session, enc, deque(indices))))

    def close(self) -> None:
        self._stop = True
        self._post(("stop", None))
        self._thread.join(timeout=10)
        self._wake_tx.close(0)
        self._ctx.term()

    def _post(self, item: Any) -> None:
        self._inbox.put(item)
        with self._wake_lock:
            if not self._stop or item[0] == "stop":
                try:
                    self._wake_tx.send(b"", zmq.NOBLOCK)
                except zmq.Again:
                    pass  # wake-ups pending already: the thread will see the inbox

    # -- the data-plane thread --------------------------------------------------------------

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake_rx, zmq.POLLIN)
        try:
            while not self._stop:
                timeout = self._send_some() if self._jobs else None
                events = dict(poller.poll(timeout))
                if self._wake_rx in events:
                    while self._wake_rx.poll(0):
                        self._wake_rx.recv()
                    self._take_inbox()
                if self._sock in events:
                    for _ in range(64):  # bounded, so sends keep going under heavy uploads
                        try:
                            frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
                        except zmq.Again:
                            break
                        self._on_message(frames)
        except Exception:
            log.exception("data plane thread failed")
        finally:
            self._sock.close(0)
            self._wake_rx.close(0)

    def _take_inbox(self) -> None:
        while True:
            try:
                kind, item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "send":
                if not item.session.closed:
                    self._jobs.append(item)
            elif kind == "close":
                self._jobs = deque(j for j in self._jobs if j.session is not item)

    def _on_message(self, frames: list[zmq.Frame]) -> None:
        peer = frames[0].bytes
        kind = frames[1].bytes if len(frames) > 1 else b""
        if kind == HELLO and len(frames) == 3:
            with self._lock:
                s = self._sessions.get(frames[2].bytes)
                if s is not None and s.peer is None:  # single use
                    s.peer = peer
                    self._by_peer[peer] = s
                else:
                    s = None
            if s is None:  # counted before the reply, so whoever gets the NO sees it
                self.frames_refused += 1
            self._reply(peer, OK if s is not None else NO)
            if s is not None:
                s.bound.set()
            return
        s = self._by_peer.get(peer)
        if s is None or s.closed or kind != BATCH or len(frames) != 4 or s.on_batch is None:
            self.frames_refused += 1
            return
        try:
            (last_seq, _flags) = BATCH_HEADER.unpack(frames[2].bytes)
        except struct.error:
            self.frames_refused += 1
            return
        self.batches_received += 1
        try:
            s.on_batch(last_seq, frames[3])
        except RuntimeError:  # the stream's event loop is closed (server stopping)
            self.frames_refused += 1

    def _reply(self, peer: bytes, msg: bytes) -> None:
        try:
            self._sock.send_multipart([peer, msg], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # the peer is gone or full; it times out its hello and uses gRPC

    def _chunk_frames(self, enc: EncodedVersion) -> list[tuple[zmq.Frame, zmq.Frame]]:
        """(header, data) frames of each chunk of ``enc``, made once and sent to every
        subscriber: a data frame points into the shared payload (zero-copy) and sending it
        again shares the same buffer, so libzmq is told about each chunk once per version,
        not once per subscriber. Dropped when ``enc`` is."""
        key = id(enc)
        got = self._frames.get(key)
        if got is None:
            got = [
                (
                    zmq.Frame(CHUNK_HEADER.pack(enc.version, enc.base_version, i)),
                    zmq.Frame(enc.chunk_view(i), copy=False),
                )
                for i in range(enc.num_chunks)
            ]
            self._frames[key] = got
            weakref.finalize(enc, self._frames.pop, key, None)
        return got

    def _send_some(self) -> int | None:
        """Send a slice of each job's chunks; returns the poll timeout in ms (None: nothing left)."""
        blocked = 0
        for _ in range(len(self._jobs)):
            job = self._jobs[0]
            s = job.session
            if s.closed or s.peer is None or not s.bound.is_set():
                self._jobs.popleft()
                continue
            sent = 0
            enc = job.enc
            while job.todo and sent < _SEND_SLICE:
                if self._max_bps > 0:
                    now = time.monotonic()
                    if now < self._next_send:
                        return max(1, int((self._next_send - now) * 1000))
                i = job.todo[0]
                head, data = self._chunk_frames(enc)[i]
                try:
                    self._sock.send_multipart([s.peer, WEIGHT, head, data], zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    blocked += 1
                    break
                except zmq.ZMQError:  # the peer vanished (EHOSTUNREACH): drop its job
                    job.todo.clear()
                    break
                job.todo.popleft()
                sent += 1
                n = len(data.buffer)
                self.weight_bytes_sent += n
                if self._max_bps > 0:
                    start = max(self._next_send, time.monotonic() - 0.05)
                    self._next_send = start + n / self._max_bps
            self._jobs.rotate(-1)
            if not job.todo:
                self._jobs.remove(job)
        if not self._jobs:
            return None
        return 2 if blocked else 0
