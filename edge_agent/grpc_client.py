"""The edge's gRPC calls to the cloud, over comms' wire schemas (``comms/proto``).

* :class:`GrpcUplink` - ``Experience.Upload`` bidirectional stream (one :class:`GrpcUploadSession`
  per connection): Arrow IPC batches out, ``UploadAck`` (highest fsynced seq) back.
* :class:`GrpcActClient` - ``Act.Act`` with a deadline, for remote inference.
* :func:`beat` - ``Heartbeat.Beat``; :func:`enroll` - ``Enrollment.Enroll``.

Every call but ``Enroll`` carries ``authorization: Bearer <credential>``.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from typing import Any

import grpc
import numpy as np
import pyarrow as pa

from comms.proto import robofleet_pb2 as pb
from comms.proto import robofleet_pb2_grpc as pbg
from edge_agent.core import Ack, UplinkUnavailable
from edge_agent.uplink import step_batch_bytes

PART_BYTES = 1024 * 1024  # one StepBatch message carries at most this much Arrow IPC
_NP_NAMES: dict[np.dtype[Any], str] = {
    np.dtype("<f4"): "F32",
    np.dtype("<f8"): "F64",
    np.dtype("<f2"): "F16",
    np.dtype("<i8"): "I64",
    np.dtype("<i4"): "I32",
    np.dtype("u1"): "U8",
    np.dtype("?"): "BOOL",
}
_NAME_NP: dict[str, np.dtype[Any]] = {v: k for k, v in _NP_NAMES.items()}


def make_channel(target: str, tls_root_pem: bytes | None = None) -> grpc.Channel:
    """A channel to ``host:port`` (TLS when a root certificate is given)."""
    opts = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
    if tls_root_pem is not None:
        return grpc.secure_channel(target, grpc.ssl_channel_credentials(tls_root_pem), opts)
    return grpc.insecure_channel(target, opts)


def _meta(credential: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {credential}")]


class GrpcUploadSession:
    """One open ``Experience.Upload`` stream. Created by :meth:`GrpcUplink.open`."""

    def __init__(self, stub: pbg.ExperienceStub, credential: str, run_id: str, timeout: float):
        self._out: queue.Queue[pb.StepBatch | None] = queue.Queue()
        self._acks: queue.Queue[Ack | BaseException] = queue.Queue()
        self.run_id = run_id
        self._call = stub.Upload(self._requests(), metadata=_meta(credential))
        self._reader = threading.Thread(target=self._read, name="edge-acks", daemon=True)
        self._reader.start()
        first = self.next_ack(timeout)
        if first is None:
            self.close()
            raise UplinkUnavailable(f"no greeting ack within {timeout} s")
        self._durable = first.durable_seq

    def _requests(self) -> Iterator[pb.StepBatch]:
        while True:
            msg = self._out.get()
            if msg is None:
                return
            yield msg

    def _read(self) -> None:
        try:
            for a in self._call:
                self._acks.put(
                    Ack(a.durable_seq, a.backpressure, a.retry_after_ms / 1000.0, a.reason)
                )
            self._acks.put(UplinkUnavailable("upload stream closed by the cloud"))
        except grpc.RpcError as exc:
            self._acks.put(
                UplinkUnavailable(f"upload stream failed: {exc.code()}: {exc.details()}")
            )

    @property
    def durable_seq(self) -> int:
        return self._durable

    def send(self, batch: pa.RecordBatch, last_seq: int) -> None:
        data = step_batch_bytes(batch)
        parts = [data[i : i + PART_BYTES] for i in range(0, len(data), PART_BYTES)] or [b""]
        for i, part in enumerate(parts):
            self._out.put(
                pb.StepBatch(
                    run_id=self.run_id,
                    last_seq=last_seq,
                    arrow_ipc=part,
                    more=i < len(parts) - 1,
                )
            )

    def next_ack(self, timeout: float) -> Ack | None:
        """The next ack, None when none came within ``timeout``.

        Raises:
            UplinkUnavailable: the stream broke (the cloud went away or refused us).
        """
        try:
            item = self._acks.get(timeout=timeout) if timeout > 0 else self._acks.get_nowait()
        except queue.Empty:
            return None
        if isinstance(item, BaseException):
            self._acks.put(item)  # stays broken for later calls
            raise item
        return item

    def close(self) -> None:
        self._out.put(None)
        self._call.cancel()


class GrpcUplink:
    """Opens upload sessions on ``channel`` for the robot holding ``credential``.

    Args:
        channel: gRPC channel to the cloud (or a site relay).
        credential: the robot's credential (from :func:`enroll`).
        run_id: the run the steps belong to.
        open_timeout_s: how long ``open`` waits for the cloud's greeting ack.
    """

    def __init__(
        self, channel: grpc.Channel, credential: str, run_id: str, open_timeout_s: float = 2.0
    ) -> None:
        self._stub = pbg.ExperienceStub(channel)
        self._credential = credential
        self._run_id = run_id
        self._timeout = open_timeout_s

    def open(self) -> GrpcUploadSession:
        """Raises UplinkUnavailable when the cloud does not answer within the open timeout."""
        try:
            return GrpcUploadSession(self._stub, self._credential, self._run_id, self._timeout)
        except grpc.RpcError as exc:
            raise UplinkUnavailable(f"cannot open upload stream: {exc}") from None


def encode_tensor(arr: np.ndarray) -> pb.Tensor:
    """A numpy array as ``Tensor`` (raw little-endian C-order bytes).

    Raises:
        TypeError: the dtype has no wire name.
    """
    a = np.ascontiguousarray(arr)
    dt = a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype
    name = _NP_NAMES.get(np.dtype(dt))
    if name is None:
        raise TypeError(f"dtype {a.dtype} cannot travel as a Tensor")
    return pb.Tensor(dtype=name, shape=list(a.shape), data=a.astype(dt, copy=False).tobytes())


def decode_tensor(t: pb.Tensor) -> np.ndarray:
    """Inverse of :func:`encode_tensor`.

    Raises:
        ValueError: unknown dtype or a byte length that does not fit the shape.
    """
    dt = _NAME_NP.get(t.dtype)
    if dt is None:
        raise ValueError(f"tensor dtype {t.dtype!r} is not one of {sorted(_NAME_NP)}")
    shape = tuple(int(s) for s in t.shape)
    n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    if any(s < 0 for s in shape) or len(t.data) != n:
        raise ValueError(f"tensor of shape {shape} {t.dtype} needs {n} bytes, got {len(t.data)}")
    return np.frombuffer(t.data, dtype=dt).reshape(shape)


class GrpcActClient:
    """Remote inference through the cloud's ``Act`` service.

    ``request`` returns a future of ``(action chunk (T, A) float32, policy_version)``; the gRPC
    deadline is ``timeout_s`` (the control loop applies its own, shorter, step deadline).
    """

    def __init__(self, channel: grpc.Channel, credential: str, run_id: str, timeout_s: float = 1.0):
        self._stub = pbg.ActStub(channel)
        self._meta = _meta(credential)
        self._run_id = run_id
        self._timeout = timeout_s

    def request(self, observation: Mapping[str, Any], task: str) -> Future[tuple[np.ndarray, int]]:
        req = pb.ActRequest(run_id=self._run_id, task=task)
        for k, v in observation.items():
            if k.startswith("observation."):
                req.observation[k].CopyFrom(encode_tensor(np.asarray(v)))
        out: Future[tuple[np.ndarray, int]] = Future()
        call = self._stub.Act.future(req, timeout=self._timeout, metadata=self._meta)

        def done(f: Any) -> None:
            try:
                reply = f.result()
                chunk = decode_tensor(reply.action).astype(np.float32)
                if chunk.ndim == 1:
                    chunk = chunk[None, :]
                out.set_result((chunk, int(reply.policy_version)))
            except BaseException as exc:  # grpc.RpcError, ValueError: the runner holds
                out.set_exception(exc)

        call.add_done_callback(done)
        return out


def beat(
    channel: grpc.Channel,
    credential: str,
    state: str,
    applied_version: int,
    stats: Mapping[str, float],
    timeout_s: float = 2.0,
) -> float:
    """Send one heartbeat; returns the cloud's clock (unix s). Raises grpc.RpcError."""
    stub = pbg.HeartbeatStub(channel)
    req = pb.HeartbeatRequest(
        state=state, applied_policy_version=applied_version, stats=dict(stats)
    )
    reply = stub.Beat(req, timeout=timeout_s, metadata=_meta(credential))
    return float(reply.server_time)


def enroll(
    channel: grpc.Channel,
    token: str,
    robot_name: str,
    robot_type: str,
    spec_json: str,
    timeout_s: float = 10.0,
) -> tuple[int, str, str]:
    """Exchange a one-time enrollment token for ``(robot_id, robot_name, credential)``.

    Raises:
        grpc.RpcError: the token is unknown, used or expired (``UNAUTHENTICATED``), or the
            cloud is unreachable.
    """
    stub = pbg.EnrollmentStub(channel)
    reply = stub.Enroll(
        pb.EnrollRequest(
            token=token, robot_name=robot_name, robot_type=robot_type, spec_json=spec_json
        ),
        timeout=timeout_s,
    )
    return int(reply.robot_id), reply.robot_name, reply.credential
