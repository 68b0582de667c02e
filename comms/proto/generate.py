"""Regenerate the protobuf and gRPC modules from ``robofleet.proto`` with grpcio-tools.

Run ``python -m comms.proto.generate`` after editing the .proto; a test checks that the
committed modules match.
"""

from __future__ import annotations

import sys
from pathlib import Path

PROTO_DIR = Path(__file__).parent
PROTO_FILE = "robofleet.proto"


def generate(out_dir: Path) -> None:
    """Compile ``robofleet.proto`` into ``out_dir`` (``*_pb2.py``, ``*_pb2_grpc.py``, ``.pyi``).

    Raises:
        RuntimeError: protoc reported an error.
    """
    from grpc_tools import protoc

    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_DIR}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        PROTO_FILE,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {PROTO_DIR / PROTO_FILE}")
    # protoc writes a top-level import; make it relative so the package imports anywhere.
    grpc_file = out_dir / "robofleet_pb2_grpc.py"
    text = grpc_file.read_text()
    grpc_file.write_text(
        text.replace(
            "import robofleet_pb2 as robofleet__pb2",
            "from . import robofleet_pb2 as robofleet__pb2",
        )
    )


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else PROTO_DIR)
