"""Helpers of the comms tests: step batches (the transport's columns, or the replay buffer's
whole schema), certificates, gRPC status codes, a robot's mark outbox (the cloud, its robots and the fast settings are
the suite's: tests.fakes.cloud, tests.fakes.settings)."""

from __future__ import annotations

import subprocess
import textwrap
import threading
from pathlib import Path

import grpc
import numpy as np
import pyarrow as pa

from buffer import StepSchema
from comms.wire.marks import EpisodeMark
from tests.fakes.cloud import RUN

# The replay buffer's schema of the tests that upload into a real buffer.
BUFFER_SCHEMA = StepSchema.from_features(
    {"observation.state": {"dtype": "float32", "shape": (3,)}},
    {"action": {"dtype": "float32", "shape": (2,)}},
)


# A robot process that opens an Upload stream (hello acknowledged), prints "streaming" and then
# holds the stream open without sending again: argv address, credential.
HOLDING_CLIENT = textwrap.dedent(
    """
    import sys, time
    from comms.robot.client import EdgeClient, make_channel
    from comms.config import CommsSettings
    from comms.proto import robofleet_pb2 as pb
    from comms.wire.credentials import credential_metadata

    address, credential = sys.argv[1], sys.argv[2]
    settings = CommsSettings(keepalive_time_s=60, keepalive_timeout_s=60)
    ch = make_channel(address, settings)
    stub = EdgeClient(ch, credential, settings).experience

    def requests():
        yield pb.StepBatch(run_id="run-1")
        time.sleep(3600)  # hangs mid-stream, never sends another message

    call = stub.Upload(requests(), metadata=credential_metadata(credential))
    next(call)
    print("streaming", flush=True)
    time.sleep(3600)
    """
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


def buffer_steps(robot_id: int, first: int, n: int, run_id: str = RUN) -> pa.RecordBatch:
    """Steps ``first .. first + n - 1`` of one episode in :data:`BUFFER_SCHEMA`."""
    return BUFFER_SCHEMA.batch_from_records(
        [
            {
                "seq": s,
                "robot_id": str(robot_id),
                "run_id": run_id,
                "task": "reach-v3",
                "episode_index": 0,
                "frame_index": s,
                "timestamp": s * 0.1,
                "reward": 0.5,
                "terminated": False,
                "truncated": False,
                "is_intervention": s % 2 == 0,
                "policy_version": 3,
                "observation.state": np.full(3, s, np.float32),
                "action": np.full(2, -s, np.float32),
            }
            for s in range(first, first + n)
        ]
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


class Outbox:
    """An in-memory ``comms.robot.mark_sender.MarkOutbox``."""

    def __init__(self, *marks: EpisodeMark) -> None:
        self.marks = list(marks)
        self.added = threading.Event()

    def pending(self) -> list[EpisodeMark]:
        return list(self.marks)

    def sent(self, mark: EpisodeMark) -> None:
        self.marks.remove(mark)

    def wait(self, timeout: float) -> bool:
        return self.added.wait(timeout)
