"""Helpers for comms tests: settings with short timeouts, robots, step batches, certificates."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import grpc
import numpy as np
import pyarrow as pa

from comms.client import EdgeClient, enroll, make_channel
from comms.config import CommsSettings
from comms.server import CloudServer
from comms.sink import MemorySink
from robofleet.store.store import MetadataStore

RUN = "run-1"


def fast_settings(**kw: object) -> CommsSettings:
    """Settings with short timeouts so fault tests finish in seconds."""
    base: dict[str, object] = dict(
        grpc_port=0,
        stream_idle_timeout_s=3.0,
        keepalive_time_s=1.0,
        keepalive_timeout_s=1.0,
        reconnect_initial_s=0.05,
        reconnect_max_s=0.5,
        call_timeout_s=5.0,
        auth_cache_s=0.0,
    )
    base.update(kw)
    return CommsSettings(**base)  # type: ignore[arg-type]


@dataclass
class Robot:
    robot_id: int
    credential: str


def enroll_robot(
    store: MetadataStore,
    address: str,
    name: str,
    settings: CommsSettings,
    lease: str | None = RUN,
    ca: Path | None = None,
) -> Robot:
    token = store.create_enrollment_token(timedelta(minutes=5))
    ch = make_channel(address, settings, ca)
    try:
        rid, cred = enroll(ch, token, name, "sim_arm")
    finally:
        ch.close()
    if lease is not None:
        store.lease_robots(lease, [rid])
    return Robot(rid, cred)


@dataclass
class Cloud:
    server: CloudServer
    sink: MemorySink
    settings: CommsSettings
    store: MetadataStore

    @property
    def address(self) -> str:
        return self.server.address

    def robot(self, name: str, lease: str | None = RUN) -> Robot:
        return enroll_robot(self.store, self.address, name, self.settings, lease)

    def client(self, robot: Robot) -> EdgeClient:
        return EdgeClient(
            make_channel(self.address, self.settings), robot.credential, self.settings
        )


def steps(robot_id: int, first_seq: int, n: int, payload_bytes: int = 16) -> pa.RecordBatch:
    """A step batch with the transport's required columns plus an opaque observation."""
    rng = np.random.default_rng(first_seq)
    obs = rng.integers(0, 255, size=(n, payload_bytes), dtype=np.uint8)
    return pa.RecordBatch.from_pydict(
        {
            "robot_id": pa.array([robot_id] * n, pa.int64()),
            "seq": pa.array(range(first_seq, first_seq + n), pa.int64()),
            "observation": pa.array(list(obs), pa.list_(pa.uint8())),
        }
    )


def self_signed_cert(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for localhost / 127.0.0.1 made with the openssl CLI."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def rpc_code(exc: BaseException) -> grpc.StatusCode | None:
    return exc.code() if isinstance(exc, grpc.RpcError) else None  # type: ignore[attr-defined]
