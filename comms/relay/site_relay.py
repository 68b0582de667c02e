"""Site relay: one cloud connection for every robot of a site.

- Uploads: each robot's stream is forwarded over the relay's single upstream HTTP/2
  connection with the robot's own credential, so the cloud still checks identity and leases
  and acknowledgements stay end to end (an ack still means "fsynced in the cloud"); so are
  the robots' episode marks (discard, rerecord).
- Weights: the relay subscribes to each run once (with the credential of a robot of that run
  that asked for it), applies versions like a robot (a delta into one complete payload),
  republishes them locally without copying them again and fans them out over ZeroMQ PUB (manifest, then chunks, plus the latest manifest once a second for late
  joiners; a chunk is ``[run, b"C", header, data]`` with the data plane's chunk header, its
  data sent straight from the version's payload). Robots fetch what they missed (or a full
  version when a delta does not fit) from the relay's Weights service, which also serves
  plain gRPC subscribers. Bytes on the cloud link per version: one copy, however many robots
  are in the site.

ZeroMQ has no authentication, so every manifest on the fan-out carries an HMAC-SHA256 keyed
by a per-relay, per-run key (:meth:`SiteRelay.fanout_key`, random at relay start). A robot gets
that key only over the relay's authenticated gRPC (in the initial metadata of a Weights.Fetch
that the cloud authorized) and drops manifests without a valid tag; chunks are bound to the
manifest by their digests (BLAKE3), so a host on the site LAN cannot make a robot apply weights.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import logging
import queue
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import zmq

from comms.cloud.distributor import Published, WeightDistributor
from comms.cloud.loop_thread import LoopThread
from comms.cloud.ratelimit import AsyncByteRate
from comms.cloud.services.common import ServerState, server_options
from comms.cloud.services.requests import add_service
from comms.config import CommsSettings
from comms.proto import robofleet_pb2 as pb
from comms.proto import robofleet_pb2_grpc as rpc
from comms.relay.servicers import RelayEpisodes, RelayExperience, RelayWeights
from comms.robot.client import EdgeClient, channel_options, make_channel
from comms.robot.grpc_subscription import GrpcWeightSubscription
from comms.robot.receiver import WeightReceiver
from comms.wire import tls
from comms.wire.credentials import credential_from
from comms.wire.dataplane_frames import CHUNK_HEADER
from comms.wire.fanout import TOPIC_CHUNK, TOPIC_MANIFEST, manifest_tag

log = logging.getLogger(__name__)

BEACON_S = 1.0


@dataclass
class _Run:
    """One run's weights at the relay."""

    distributor: WeightDistributor
    receiver: WeightReceiver
    subscription: GrpcWeightSubscription | None = None
    authorized: dict[str, float] = field(default_factory=dict)  # credential -> checked at


class _RelayAuth:
    """Checks a robot's right to a run's weights upstream (cached), never locally."""

    def __init__(self, relay: SiteRelay) -> None:
        self.relay = relay

    def identify_call(self, metadata: Any) -> Any:
        """The call's bearer credential itself: the cloud checks it (:meth:`require_lease`)."""
        return credential_from(metadata)

    def require_lease(self, credential: str, run_id: str) -> None:
        self.relay.authorize(credential, run_id)

    def invalidate(self) -> None:  # pragma: no cover - nothing cached beyond runs
        pass


class SiteRelay:
    """A site relay.

    Args:
        settings: ``comms`` settings (``relay_port``, ``relay_zmq_port``, ``cloud_address``,
            TLS files: ``tls_ca_file`` to trust the cloud, cert/key to serve robots over TLS).
        cloud_address: overrides ``settings.cloud_address``.
        port / zmq_port: override the settings (0 = any free port).

    Attributes:
        upstream_weight_bytes: weight bytes received from the cloud (chunks, incl. re-fetches).
    """

    def __init__(
        self,
        settings: CommsSettings,
        *,
        cloud_address: str | None = None,
        port: int | None = None,
        zmq_port: int | None = None,
        cloud_ca: Path | None = None,
    ) -> None:
        self.settings = settings
        self.cloud_address = cloud_address or settings.cloud_address
        self._port = settings.relay_port if port is None else port
        self._zmq_port = settings.relay_zmq_port if zmq_port is None else zmq_port
        self._cloud_ca = cloud_ca or settings.tls_ca_file
        self.runs: dict[str, _Run] = {}
        self._runs_lock = threading.Lock()
        self.upstream = make_channel(self.cloud_address, settings, self._cloud_ca)
        self.upstream_aio: grpc.aio.Channel | None = None
        # The relay serves weights only; auth is asked of the cloud, nothing is stored here.
        self.state = ServerState(
            settings=settings,
            store=None,
            auth=_RelayAuth(self),  # type: ignore[arg-type]
            sinks=_no_sink,
        )
        self.upload_bytes = 0
        self._fanout_secret = secrets.token_bytes(32)
        self._loop: LoopThread | None = None
        self._server: grpc.aio.Server | None = None
        # ("manifest" | "chunk" | "published", run id, what), None to stop
        self._fanout: queue.Queue[tuple[str, str, Any] | None] = queue.Queue()
        self._zmq_ctx = zmq.Context()
        self._pub_sock: zmq.Socket[bytes] | None = None
        self._zmq_thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.port = 0
        self.zmq_port = 0

    @property
    def address(self) -> str:
        return f"{self.settings.bind_host}:{self.port}"

    @property
    def zmq_address(self) -> str:
        return f"tcp://{self.settings.bind_host}:{self.zmq_port}"

    @property
    def upstream_weight_bytes(self) -> int:
        return sum(
            r.subscription.bytes_received for r in self.runs.values() if r.subscription is not None
        )

    def start(self) -> tuple[int, int]:
        """Serve robots; returns (gRPC port, ZeroMQ port)."""
        sock = self._zmq_ctx.socket(zmq.PUB)
        sock.setsockopt(zmq.SNDHWM, 100_000)
        sock.setsockopt(zmq.LINGER, 0)
        if self._zmq_port:
            sock.bind(f"tcp://{self.settings.bind_host}:{self._zmq_port}")
            self.zmq_port = self._zmq_port
        else:
            self.zmq_port = sock.bind_to_random_port(f"tcp://{self.settings.bind_host}")
        self._pub_sock = sock
        self._zmq_thread = threading.Thread(target=self._fan_out, name="relay-zmq", daemon=True)
        self._zmq_thread.start()
        self._loop = LoopThread("comms-relay")
        self.state.loop = self._loop.loop
        self.port = self._loop.run(self._start())
        log.info(
            "site relay on %s (zmq %s) -> cloud %s",
            self.address,
            self.zmq_address,
            self.cloud_address,
        )
        return self.port, self.zmq_port

    async def _start(self) -> int:
        s = self.settings
        self.state.rate = AsyncByteRate(0)
        opts = channel_options(s)
        if self._cloud_ca is not None:
            self.upstream_aio = grpc.aio.secure_channel(
                self.cloud_address, tls.channel_credentials(self._cloud_ca), options=opts
            )
        else:
            self.upstream_aio = grpc.aio.insecure_channel(self.cloud_address, options=opts)
        server = grpc.aio.server(
            options=server_options(s), maximum_concurrent_rpcs=s.max_concurrent_streams
        )
        rpc.add_ExperienceServicer_to_server(RelayExperience(self), server)
        rpc.add_EpisodesServicer_to_server(RelayEpisodes(self), server)
        add_service(server, RelayWeights(self.state, self), "Weights")
        target = f"{s.bind_host}:{self._port}"
        if s.tls_cert_file is not None and s.tls_key_file is not None:
            port = server.add_secure_port(
                target, tls.server_credentials(s.tls_cert_file, s.tls_key_file)
            )
        else:
            port = server.add_insecure_port(target)
        await server.start()
        self._server = server
        return port

    def stop(self) -> None:
        self._stop.set()
        self._fanout.put(None)
        for run in list(self.runs.values()):
            if run.subscription is not None:
                run.subscription.close()
            run.distributor.close()
        if self._loop is not None:
            if self._server is not None:
                self._loop.run(self._server.stop(0))
            if self.upstream_aio is not None:
                self._loop.run(self.upstream_aio.close())
            self._loop.stop()
            self._loop = None
        if self._zmq_thread is not None:
            self._zmq_thread.join(timeout=5)
        if self._pub_sock is not None:
            self._pub_sock.close(0)
        self._zmq_ctx.term()
        self.upstream.close()

    # -- weights -----------------------------------------------------------------------------

    def authorize(self, credential: str | None, run_id: str) -> None:
        """Let ``credential`` read ``run_id``'s weights if the cloud agrees (cached); the first
        authorized robot's credential starts the relay's single upstream subscription.

        Raises:
            AuthError: the cloud refused (unknown credential or no lease).
        """
        from comms.cloud.auth import AuthError
        from comms.wire.credentials import credential_metadata

        if not credential:
            raise AuthError("missing robot credential", unauthenticated=True)
        run = self._run(run_id)
        checked = run.authorized.get(credential)
        if checked is not None and time.monotonic() - checked < max(
            self.settings.auth_cache_s, 5.0
        ):
            return
        try:
            list(
                rpc.WeightsStub(self.upstream).Fetch(
                    pb.FetchRequest(run_id=run_id, version=-1, manifest_only=True),
                    metadata=credential_metadata(credential),
                    timeout=self.settings.call_timeout_s,
                )
            )
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            if code == grpc.StatusCode.UNAUTHENTICATED:
                raise AuthError(
                    "unknown or revoked robot credential", unauthenticated=True
                ) from None
            if code == grpc.StatusCode.PERMISSION_DENIED:
                raise AuthError(exc.details() or "no lease", unauthenticated=False) from None
            if code != grpc.StatusCode.NOT_FOUND:  # NOT_FOUND: allowed, no version yet
                raise
        run.authorized[credential] = time.monotonic()
        with self._runs_lock:
            if run.subscription is None:
                client = EdgeClient(
                    self.upstream, credential, self.settings, address=self.cloud_address
                )
                run.subscription = GrpcWeightSubscription(
                    client,
                    run_id,
                    run.receiver,
                    on_manifest=functools.partial(self._cut_manifest, run_id),
                    on_chunk=functools.partial(self._cut_chunk, run_id),
                )

    def _run(self, run_id: str) -> _Run:
        with self._runs_lock:
            run = self.runs.get(run_id)
            if run is None:
                dist = WeightDistributor(run_id, self.settings.weight_chunk_bytes)
                rx = WeightReceiver(
                    on_applied=functools.partial(self._republish, run_id), whole_versions=True
                )
                run = self.runs[run_id] = _Run(dist, rx)
                self.state.attach(dist)
                dist.add_listener(functools.partial(self._queue_fanout, run_id))
            return run

    def _queue_fanout(self, run_id: str, published: Published) -> None:
        self._fanout.put(("published", run_id, published))

    def _cut_manifest(self, run_id: str, m: pb.Manifest) -> None:
        """Cut-through: a version the relay starts receiving goes out at once, its manifest
        first, then each chunk as soon as its digest checked, so the robots' copy overlaps
        the relay's instead of waiting for the whole version (the extra hop)."""
        self._fanout.put(("manifest", run_id, m))

    def _cut_chunk(self, run_id: str, m: pb.Manifest, index: int, data: memoryview) -> None:
        self._fanout.put(("chunk", run_id, (m, index, data)))

    def _republish(self, run_id: str, version: int) -> None:
        run = self.runs[run_id]
        full = run.receiver.current_full()
        if full is not None and full[0].version == version:
            # A full version as verified: its payload and digests as they came, no copy (an
            # older cloud's SHA-256 digests are not reused: BLAKE3 ones are computed).
            m, payload = full
            digests = (int(m.chunk_bytes), list(m.chunk_blake3)) if m.chunk_blake3 else None
            run.distributor.publish_safetensors(
                payload, version=version, learner_step=int(m.learner_step), digests=digests
            )
            return
        whole = run.receiver.current_payload()
        if whole is not None and whole[0] == version:
            # A delta, applied into one complete payload: republished as it is (hashed here),
            # not copied again; the relay holds two versions at most, not three.
            run.distributor.publish_safetensors(whole[2], version=version, learner_step=whole[1])
            return
        v, state = run.receiver.current_arrays()  # typed, so BF16 stays BF16
        if v == version:
            run.distributor.publish(state, version=version)

    def fanout_key(self, run_id: str) -> bytes:
        """The HMAC key of ``run_id``'s manifests on the fan-out (this relay process only)."""
        return hmac.new(self._fanout_secret, run_id.encode(), hashlib.sha256).digest()

    def _send_manifest(self, sock: zmq.Socket[bytes], run_id: str, m: pb.Manifest) -> None:
        body = m.SerializeToString()
        tag = manifest_tag(self.fanout_key(run_id), body)
        sock.send_multipart([run_id.encode(), TOPIC_MANIFEST, body, tag])

    def _fan_out(self) -> None:
        """ZeroMQ sender: what the cut-through forwards (manifests, checked chunks) and the
        newest version of each run that was not forwarded so, then a beacon of its manifest."""
        assert self._pub_sock is not None
        sock = self._pub_sock
        last: dict[str, pb.Manifest] = {}  # per run, the newest manifest sent
        while not self._stop.is_set():
            try:
                item = self._fanout.get(timeout=BEACON_S)
            except queue.Empty:
                for run_id, m in last.items():
                    self._send_manifest(sock, run_id, m)
                continue
            queued = [item, *_drain(self._fanout)]
            items = [x for x in queued if x is not None]
            if len(items) < len(queued):
                return
            newest = {run: pub for kind, run, pub in items if kind == "published"}
            for kind, run_id, x in items:
                if kind == "manifest":
                    self._send_manifest(sock, run_id, x)
                    last[run_id] = x
                elif kind == "chunk":
                    m, index, data = x
                    head = CHUNK_HEADER.pack(m.version, m.base_version, index)
                    _send_chunk(sock, run_id, head, data)
                elif newest[run_id] is x:  # latest-only: older published ones are skipped
                    sent = last.get(run_id)
                    if sent is None or x.version > sent.version:  # not cut through already
                        last[run_id] = self._send_version(sock, run_id, x)

    def _send_version(self, sock: zmq.Socket[bytes], run_id: str, pub: Published) -> pb.Manifest:
        enc = pub.delta or pub.full
        self._send_manifest(sock, run_id, enc.manifest)
        for i in range(enc.num_chunks):
            head = CHUNK_HEADER.pack(enc.version, enc.base_version, i)
            _send_chunk(sock, run_id, head, enc.chunk_view(i))
        return enc.manifest


def _send_chunk(sock: zmq.Socket[bytes], run_id: str, head: bytes, data: memoryview) -> None:
    # copy=False: the frame points into the version's payload, which it keeps alive; every
    # robot's socket shares that one message.
    sock.send_multipart([run_id.encode(), TOPIC_CHUNK, head, data], copy=False)


def _no_sink(_run_id: str) -> None:
    return None


def _drain(q: queue.Queue[Any]) -> list[Any]:
    out = []
    while True:
        try:
            out.append(q.get_nowait())
        except queue.Empty:
            return out
