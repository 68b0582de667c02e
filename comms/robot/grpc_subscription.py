"""A weight subscription over gRPC: keeps a :class:`~comms.robot.receiver.WeightReceiver` at the
newest version of a run, from the Weights service (cloud or relay).

A background thread holds a Subscribe stream, assembles each version, re-fetches chunks that
failed their digest check or never came (a truncated stream), applies complete versions only,
acknowledges each version so the server sends the next (newest) one (flow control: a slow robot
skips versions instead of queueing them), and re-subscribes with exponential backoff and jitter
when the stream breaks.

With ``comms.data_plane`` on, the subscription asks for the server's ZeroMQ data plane
(:mod:`comms.cloud.dataplane`): manifests and acks stay on the gRPC stream, the chunks of a version
come as ZeroMQ frames and are checked against the manifest's digests exactly like gRPC chunks.
When the data plane cannot be reached the chunks come on the stream; when it stops delivering
(no chunk for ``data_plane_stall_s``) the version is completed by Fetch and the server is told
to use the stream again.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import zmq

from comms.proto import robofleet_pb2 as pb
from comms.robot import dataplane_client
from comms.robot.client import EdgeClient
from comms.robot.receiver import VersionAssembler, WeightReceiver
from comms.wire.dataplane_frames import CHUNK_HEADER, WEIGHT
from comms.wire.weight_codec import WeightFormatError, chunk_check
from foundation.retry import Backoff

log = logging.getLogger(__name__)


class GrpcWeightSubscription:
    """Keeps ``receiver`` at the latest version of ``run_id``.

    ``on_manifest(manifest)`` is called when a version starts to be assembled and
    ``on_chunk(manifest, index, chunk)`` for each of its chunks once checked (a site relay
    forwards them so, before the version is complete); both run on the subscription's threads.

    Attributes:
        versions_applied, chunks_refused, refetches, bytes_received: counters.
    """

    def __init__(
        self,
        client: EdgeClient,
        run_id: str,
        receiver: WeightReceiver,
        on_manifest: Callable[[pb.Manifest], object] | None = None,
        on_chunk: Callable[[pb.Manifest, int, memoryview], object] | None = None,
    ) -> None:
        self._on_manifest_hook = on_manifest
        self._on_chunk_hook = on_chunk
        self._client = client
        self._run_id = run_id
        self._rx = receiver
        self._stop = threading.Event()
        self._call: Any = None
        self.versions_applied = 0
        self.chunks_refused = 0
        self.refetches = 0
        self.bytes_received = 0
        self.data_plane_bytes = 0  # of bytes_received, those that came on the data plane
        self._dp: zmq.Socket[bytes] | None = None
        self._thread = threading.Thread(target=self._run, name=f"weights-rx-{run_id}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        call = self._call
        if call is not None:
            call.cancel()
        self._thread.join(timeout=10)

    def refetch(self, version: int, base: int, indices: list[int]) -> Iterable[pb.WeightMessage]:
        """Fetch chunks of a version again (bounded by the call deadline)."""
        self.refetches += 1
        msgs = self._client.fetch_chunks(self._run_id, version, base, indices)
        self.bytes_received += sum(len(m.chunk.data) for m in msgs if m.HasField("chunk"))
        return msgs

    def _finish(self, asm: VersionAssembler) -> bool:
        """Repair and apply; returns False when the version could not be applied."""
        if not asm.complete:
            asm.repair(self.refetch)
        self.chunks_refused += asm.rejected
        asm.rejected = 0
        if asm.complete and self._rx.apply(asm):
            self.versions_applied += 1
            return True
        log.warning("version %d not applied (missing %d chunks)", asm.key[0], len(asm.missing))
        return False

    def _data_plane_chunks(self, asm: VersionAssembler | None, expected: int) -> bool:
        """Receive a version's chunks from the data plane into ``asm`` (None: drain them);
        returns False when not one came within ``data_plane_stall_s`` (the plane is lost)."""
        sock = self._dp
        if sock is None:
            return False
        stall_ms = int(self._client.settings.data_plane_stall_s * 1000)
        got = 0
        key = asm.key if asm is not None else None
        while got < expected and not self._stop.is_set():
            if not sock.poll(stall_ms):
                return got > 0
            frames = sock.recv_multipart(copy=False)
            if len(frames) != 3 or frames[0].bytes != WEIGHT:
                continue
            try:
                version, base, index = CHUNK_HEADER.unpack(frames[1].bytes)
            except Exception:
                continue
            if key is not None and (version, base) != key:
                continue  # a late chunk of an earlier version
            data = frames[2].buffer
            self.bytes_received += len(data)
            self.data_plane_bytes += len(data)
            got += 1
            if asm is not None:
                asm.add_buffer(version, base, index, data)
        return True

    def _drop_data_plane(self) -> None:
        if self._dp is not None:
            self._dp.close(0)
            self._dp = None

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            self._drop_data_plane()

    def _loop(self) -> None:
        s = self._client.settings
        backoff = Backoff(s.reconnect_initial_s, s.reconnect_max_s)
        while not self._stop.is_set():
            st = _Stream()
            self._drop_data_plane()  # a new stream offers a new token
            try:
                self._stream_once(st, backoff)
            except grpc.RpcError as exc:
                if self._stop.is_set():
                    return
                code = exc.code() if hasattr(exc, "code") else None
                log.info("weight stream lost (%s)", code)
                if st.asm is not None and code != grpc.StatusCode.CANCELLED:
                    try:
                        self._finish(st.asm)
                    except Exception:  # the source is unreachable; the version stays unapplied
                        pass
            finally:
                st.acks.put(None)  # ends the request stream
                if self._call is not None:
                    self._call.cancel()
            if backoff.sleep(self._stop):
                return

    def _stream_once(self, st: _Stream, backoff: Backoff) -> None:
        """One Subscribe call, until it ends or a version cannot be applied (then the caller
        re-subscribes, which re-syncs the server with the version held)."""
        s = self._client.settings
        first = pb.SubscribeRequest(
            run_id=self._run_id, have_version=self._rx.version, data_plane=s.data_plane
        )
        call = self._client.weights.Subscribe(
            _requests(first, st.acks), metadata=self._client.metadata
        )
        self._call = call
        for msg in call:
            if msg.HasField("data_plane"):
                self._dp = dataplane_client.connect(
                    msg.data_plane,
                    s.data_plane_handshake_s,
                    require_curve=s.tls_ca_file is not None,
                    dialed=self._client.address,
                )
                ok = True
            elif msg.HasField("manifest") and msg.chunks_on_data_plane:
                ok = self._on_data_plane_version(st, msg.manifest, backoff)
            elif msg.HasField("manifest"):
                ok = self._on_manifest(st, msg.manifest)
            else:
                ok = self._on_chunk(st, msg.chunk, backoff)
            if not ok:
                break
        # The stream ended: a half-received version is completed by Fetch or dropped.
        if st.asm is not None:
            self._finish(st.asm)

    def _assembler(self, manifest: pb.Manifest) -> VersionAssembler | None:
        """An assembler for a version the receiver wants; None for one held already or refused."""
        if not self._rx.wants(manifest):
            return None
        hook = self._on_chunk_hook
        verified = None if hook is None else functools.partial(hook, manifest)
        try:
            asm = self._rx.new_assembler(manifest, on_verified=verified)
        except WeightFormatError as exc:
            log.error("manifest refused: %s", exc)
            return None
        if self._on_manifest_hook is not None:
            self._on_manifest_hook(manifest)
        return asm

    def _on_data_plane_version(self, st: _Stream, manifest: pb.Manifest, backoff: Backoff) -> bool:
        """A manifest whose chunks come on the data plane: receive, repair, apply, ack.
        Returns False when a version could not be applied (re-subscribe)."""
        if st.asm is not None and not self._finish(st.asm):
            return False
        st.version = int(manifest.version)
        st.asm = self._assembler(manifest)
        n = len(chunk_check(manifest)[1])
        lost = not self._data_plane_chunks(st.asm, n) and n > 0
        if lost:
            log.info("no chunk on the data plane; back to the gRPC stream")
            self._drop_data_plane()
        ok = st.asm is None or self._finish(st.asm)  # repairs over gRPC (Fetch)
        st.asm = None
        if not ok:
            return False
        backoff.reset()
        ack = _ack(self._rx.version, st.version)
        ack.data_plane_failed = lost
        st.acks.put(ack)
        return True

    def _on_manifest(self, st: _Stream, manifest: pb.Manifest) -> bool:
        """A manifest whose chunks follow on this stream; returns False to re-subscribe."""
        if st.asm is not None and not self._finish(st.asm):
            return False  # the server assumes we hold it: re-subscribe to re-sync
        st.asm, st.seen = None, 0
        st.version = int(manifest.version)
        st.expected = len(chunk_check(manifest)[1])
        st.asm = self._assembler(manifest)
        if st.expected == 0:  # nothing follows
            if st.asm is not None and not self._finish(st.asm):
                return False
            st.asm = None
            st.acks.put(_ack(self._rx.version, st.version))
        elif st.asm is None:
            st.seen = -1  # the chunks that follow are skipped
        return True

    def _on_chunk(self, st: _Stream, chunk: pb.Chunk, backoff: Backoff) -> bool:
        """A chunk on this stream; the version is applied after its last one. Returns False
        when it could not be applied (re-subscribe)."""
        self.bytes_received += len(chunk.data)
        if st.seen < 0:
            # A version held already or refused: ack once its last chunk passed.
            if chunk.index == st.expected - 1:
                st.acks.put(_ack(self._rx.version, st.version))
            return True
        st.seen += 1
        assert st.asm is not None
        st.asm.add_async(chunk)
        if st.seen == st.expected:
            backoff.reset()
            ok = self._finish(st.asm)
            st.asm = None
            if not ok:
                return False
            # Flow control: the server sends the next (newest) version only now.
            st.acks.put(_ack(self._rx.version, st.version))
        return True


@dataclass
class _Stream:
    """One Subscribe call's progress: the version being assembled and the acks to send."""

    acks: queue.SimpleQueue[pb.SubscribeRequest | None] = field(default_factory=queue.SimpleQueue)
    asm: VersionAssembler | None = None
    version: int = -1  # of the last manifest
    expected: int = 0  # chunks of that version on this stream
    seen: int = 0  # of them received; -1: they are skipped


def _ack(have: int, done: int) -> pb.SubscribeRequest:
    return pb.SubscribeRequest(have_version=have, done_version=done)


def _requests(
    first: pb.SubscribeRequest, acks: queue.SimpleQueue[pb.SubscribeRequest | None]
) -> Iterator[pb.SubscribeRequest]:
    """The Subscribe request stream: the opening request, then one ack per version received."""
    yield first
    while (ack := acks.get()) is not None:
        yield ack
