"""A weight subscription through a site relay's ZeroMQ fan-out: keeps a
:class:`~comms.robot.receiver.WeightReceiver` at the newest version of a run.

The robot first asks the relay (gRPC, with its credential) for the run, which also makes the
relay subscribe upstream; then it listens on the relay's PUB socket. Chunks that fail their
digest check or never arrive, and full versions when a delta does not fit the version held,
are fetched from the relay's Weights service. Only complete, verified versions are applied.
With no authentic manifest for ``REGISTER_AGAIN_S`` (the relay beacons every second) the robot
registers again: a restarted relay has a new fan-out key and follows no run until asked. While
the relay answers that it holds no version yet (a run before its first version), the wait
doubles up to ``REGISTER_AGAIN_MAX_S``: a thousand robots do not poll their relay every few
seconds through a long warm-up.

Manifests on the fan-out must carry the HMAC tag of the relay's run key, which the robot got
over authenticated gRPC (see :mod:`comms.wire.fanout`); untagged or mistagged ones are dropped,
so nothing injected on the site LAN is ever applied.
"""

from __future__ import annotations

import hmac
import logging
import struct
import threading
import time

import grpc
import zmq
from google.protobuf.message import DecodeError

from comms.proto import robofleet_pb2 as pb
from comms.robot.client import EdgeClient
from comms.robot.receiver import VersionAssembler, WeightReceiver
from comms.wire.dataplane_frames import CHUNK_HEADER
from comms.wire.fanout import FANOUT_KEY_HEADER, TOPIC_CHUNK, TOPIC_MANIFEST, manifest_tag
from comms.wire.weight_codec import FULL_BASE, WeightFormatError
from foundation.retry import Backoff

log = logging.getLogger(__name__)

STALL_S = 1.0  # an unfinished version with no chunk for this long is repaired by Fetch
# The relay beacons its latest manifest every second: with no authentic manifest for this long
# the relay restarted (a new fan-out key, and it follows no run until a robot asks) or holds no
# version yet, and the robot registers again.
REGISTER_AGAIN_S = 5.0
REGISTER_AGAIN_MAX_S = 60.0  # the longest wait while the relay holds no version of the run
RECEIVE_QUEUE_MESSAGES = 64  # fan-out messages (a chunk is <= 1 MiB) queued in the robot at most


class ZmqWeightSubscription:
    """Keeps ``receiver`` at the latest version of ``run_id`` via the site relay.

    Args:
        relay_client: an :class:`EdgeClient` connected to the relay's gRPC port.
        zmq_address: the relay's PUB endpoint (``tcp://host:port``).
        run_id: the run whose weights to follow.
        receiver: where versions are applied.
    """

    def __init__(
        self, relay_client: EdgeClient, zmq_address: str, run_id: str, receiver: WeightReceiver
    ) -> None:
        self._client = relay_client
        self._address = zmq_address
        self._run_id = run_id
        self._rx = receiver
        self._stop = threading.Event()
        self.bytes_received = 0
        self.fetched_bytes = 0
        self.chunks_refused = 0
        self.manifests_refused = 0  # fan-out manifests without a valid HMAC tag
        self._key: bytes | None = None
        self._asm: VersionAssembler | None = None  # the version being assembled
        self._last_chunk = 0.0  # monotonic s of its last chunk
        self._last_authentic = 0.0  # monotonic s of the last manifest with a valid tag
        self.registrations = 0
        self._register_after = REGISTER_AGAIN_S  # seconds of silence before registering again
        self._thread = threading.Thread(target=self._run, name=f"zmq-rx-{run_id}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _fetch(self, version: int, base: int, indices: list[int]) -> list[pb.WeightMessage]:
        msgs = self._client.fetch_chunks(self._run_id, version, base, indices)
        self.fetched_bytes += sum(len(m.chunk.data) for m in msgs if m.HasField("chunk"))
        return msgs

    def _register(self) -> None:
        """Prove our right to the run to the relay (which then subscribes upstream), and catch
        up at once when the relay already holds a version."""
        s = self._client.settings
        backoff = Backoff(s.reconnect_initial_s, s.reconnect_max_s)
        while not self._stop.is_set():
            call = self._client.weights.Fetch(
                pb.FetchRequest(run_id=self._run_id, version=-1, manifest_only=True),
                metadata=self._client.metadata,
                timeout=s.call_timeout_s,
            )
            try:
                msgs = list(call)
                self._take_key(call)
                self._registered(holds_version=bool(msgs))
                if msgs and msgs[0].manifest.version > self._rx.version:
                    self._full(int(msgs[0].manifest.version))
                return
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                if code == grpc.StatusCode.NOT_FOUND and self._take_key(call):
                    self._registered(holds_version=False)
                    return  # allowed; no version yet
                log.info("relay refused or unreachable (%s); retrying", code)
            if backoff.sleep(self._stop):
                return

    def _registered(self, holds_version: bool) -> None:
        self.registrations += 1
        self._last_authentic = time.monotonic()  # the next wait counts from here
        if holds_version or self.registrations == 1:
            self._register_after = REGISTER_AGAIN_S
        else:  # registered again and the relay still holds no version: wait longer
            self._register_after = min(2 * self._register_after, REGISTER_AGAIN_MAX_S)

    def _take_key(self, call: grpc.Call) -> bool:
        """Keep the fan-out key from the call's initial metadata; returns whether it had one."""
        for k, v in call.initial_metadata() or ():
            if k == FANOUT_KEY_HEADER:
                try:
                    self._key = bytes.fromhex(v if isinstance(v, str) else v.decode())
                    return True
                except ValueError:
                    break
        log.warning("the relay sent no valid fan-out key; fan-out manifests will be dropped")
        return False

    def _authentic(self, frames: list[bytes], body: bytes) -> bool:
        ok = (
            self._key is not None
            and len(frames) == 4
            and hmac.compare_digest(frames[3], manifest_tag(self._key, body))
        )
        if not ok:
            self.manifests_refused += 1
        else:
            self._last_authentic = time.monotonic()
            self._register_after = REGISTER_AGAIN_S
        return ok

    def _finish(self, asm: VersionAssembler) -> None:
        if not asm.complete:
            asm.repair(self._fetch)
        self.chunks_refused += asm.rejected
        asm.rejected = 0
        if asm.complete:
            self._rx.apply(asm)

    def _full(self, version: int) -> None:
        """Fetch and apply the full ``version`` (late joiner or a delta onto another base)."""
        try:
            msgs = self._fetch(version, FULL_BASE, [])
        except grpc.RpcError as exc:
            log.info(
                "full version %d not fetched: %s",
                version,
                exc.code() if hasattr(exc, "code") else exc,
            )
            return
        if not msgs or not msgs[0].HasField("manifest"):
            return
        asm = self._rx.new_assembler(msgs[0].manifest)
        for m in msgs[1:]:
            asm.add(m.chunk)
        self._finish(asm)

    def _run(self) -> None:
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        sock = ctx.socket(zmq.SUB)
        # Bounded, as the data plane's (comms.robot.dataplane_client): a robot slower than the
        # fan-out leaves the backlog in the relay's PUB queue (references to the version's
        # payload, SNDHWM 100,000 chunks) instead of holding a copy of the version in its own.
        sock.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE_MESSAGES)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, self._run_id.encode())
        if "://[" in self._address:  # an IPv6 relay: libzmq dials IPv4 only unless told
            sock.setsockopt(zmq.IPV6, 1)
        sock.connect(self._address)
        try:
            self._register()
            self._listen(sock)
        finally:
            sock.close(0)

    def _listen(self, sock: zmq.Socket[bytes]) -> None:
        """Assemble what the fan-out sends until closed; a version with no chunk for
        ``STALL_S`` is completed by Fetch."""
        self._asm = None
        self._last_chunk = time.monotonic()
        while not self._stop.is_set():
            if time.monotonic() - self._last_authentic > self._register_after:
                # Debug only: a relay that holds no version yet is quiet for minutes.
                log.debug(
                    "no manifest from the relay for %.0fs; registering again", self._register_after
                )
                self._finish_current()
                self._register()
            if not sock.poll(200):
                if self._asm is not None and time.monotonic() - self._last_chunk > STALL_S:
                    self._finish_current()
                continue
            # copy=False: a chunk's data goes from ZeroMQ's buffer straight into the staging
            # buffer (one copy), hashed there on the verify threads.
            frames = sock.recv_multipart(copy=False)
            if len(frames) < 3:
                continue
            kind = frames[1].bytes
            if kind == TOPIC_MANIFEST:
                body = frames[2].bytes
                self.bytes_received += len(body)
                if self._authentic([f.bytes for f in frames], body):
                    self._on_manifest(body)
            elif kind == TOPIC_CHUNK and len(frames) == 4:
                data = frames[3].buffer
                self.bytes_received += len(data)
                self._on_chunk(frames[2].bytes, data)

    def _finish_current(self) -> None:
        if self._asm is not None:
            self._finish(self._asm)
            self._asm = None

    def _on_manifest(self, body: bytes) -> None:
        """A manifest whose tag checked: start its version (or ignore a beacon of this one)."""
        try:
            m = pb.Manifest.FromString(body)
        except DecodeError:
            self.manifests_refused += 1
            return
        asm = self._asm
        if asm is not None and asm.key == (m.version, m.base_version):
            if time.monotonic() - self._last_chunk > STALL_S:  # a beacon: the send is over
                self._finish_current()
            return
        self._finish_current()
        if m.version <= self._rx.version:
            return
        if not self._rx.wants(m):
            self._full(int(m.version))  # a delta onto a version we do not hold
            return
        try:
            self._asm = self._rx.new_assembler(m)
            self._last_chunk = time.monotonic()
        except WeightFormatError as exc:
            log.error("manifest refused: %s", exc)

    def _on_chunk(self, header: bytes, data: memoryview) -> None:
        asm = self._asm
        if asm is None:
            return
        try:
            version, base, index = CHUNK_HEADER.unpack(header)
        except struct.error:
            self.chunks_refused += 1
            return
        asm.add_buffer(version, base, index, data)
        self._last_chunk = time.monotonic()
        if asm.staged_all and asm.complete:
            self._finish_current()
