"""Transport settings (the ``comms:`` section, ``ROBOFLEET_COMMS__*``)."""

from pathlib import Path

from pydantic import BaseModel, Field


class CommsSettings(BaseModel):
    """gRPC and ZeroMQ endpoints. Every server binds to loopback unless told otherwise."""

    bind_host: str = Field(default="127.0.0.1", description="Address the gRPC server binds to.")
    grpc_port: int = Field(
        default=50051, ge=0, le=65535, description="Cloud gRPC port (0 = any free port)."
    )
    relay_port: int = Field(default=50061, ge=0, le=65535, description="Site relay gRPC port.")
    relay_zmq_port: int = Field(
        default=50062, ge=0, le=65535, description="Site relay ZeroMQ fan-out port."
    )
    tls_cert_file: Path | None = Field(
        default=None, description="PEM certificate; TLS is on when set."
    )
    tls_key_file: Path | None = Field(
        default=None, description="PEM private key for tls_cert_file."
    )
    enrollment_token_ttl_s: int = Field(
        default=3600, gt=0, description="Lifetime of an enrollment token."
    )
    weight_chunk_bytes: int = Field(
        default=1024 * 1024, gt=0, le=1024 * 1024, description="Weight chunk size (at most 1 MiB)."
    )
