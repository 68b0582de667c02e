"""The committed generated modules are what grpcio-tools makes from the .proto today."""

from __future__ import annotations

from pathlib import Path

from comms.proto import generate


def test_generated_modules_match_proto(tmp_path: Path) -> None:
    generate.generate(tmp_path)
    names = ["robofleet_pb2.py", "robofleet_pb2.pyi", "robofleet_pb2_grpc.py"]
    for name in names:
        fresh = (tmp_path / name).read_text()
        committed = (generate.PROTO_DIR / name).read_text()
        assert fresh == committed, f"{name} is stale: run python -m comms.proto.generate"
