"""Transport settings (the ``comms:`` section, ``ROBOFLEET_COMMS__*``)."""

from pathlib import Path
from typing import Self

from pydantic import BaseModel, Field, model_validator


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
    cloud_address: str = Field(
        default="127.0.0.1:50051", description="host:port of the cloud gRPC server (edge, relay)."
    )
    tls_cert_file: Path | None = Field(
        default=None, description="PEM certificate; TLS is on when set."
    )
    tls_key_file: Path | None = Field(
        default=None, description="PEM private key for tls_cert_file."
    )
    tls_ca_file: Path | None = Field(
        default=None, description="PEM root a client trusts (the self-signed cert itself)."
    )
    enrollment_token_ttl_s: int = Field(
        default=3600, gt=0, description="Lifetime of an enrollment token."
    )
    weight_chunk_bytes: int = Field(
        default=1024 * 1024, gt=0, le=1024 * 1024, description="Weight chunk size (at most 1 MiB)."
    )
    weight_max_bytes_per_s: float = Field(
        default=0.0,
        ge=0.0,
        description="Cap on weight bytes/s sent by one server to all subscribers (0 = no cap).",
    )
    upload_part_bytes: int = Field(
        default=1024 * 1024,
        gt=0,
        le=3 * 1024 * 1024,
        description="Step batches larger than this are split into parts (gRPC's limit is 4 MB).",
    )
    max_upload_batch_bytes: int = Field(
        default=256 * 1024 * 1024, gt=0, description="Largest reassembled step batch accepted."
    )
    tune_malloc: bool = Field(
        default=True,
        description="When the data plane starts, keep freed message-sized blocks in the "
        "process's heap (glibc mmap/trim thresholds; see comms.cloud.allocator): received batches "
        "then reuse faulted-in pages. Costs up to 64 MiB of freed heap kept resident.",
    )
    upload_window: int = Field(
        default=64, gt=0, description="Step batches a client sends before waiting for an ack."
    )
    upload_window_bytes: int = Field(
        default=32 * 1024 * 1024,
        gt=0,
        description="A client sends no more step batches while this many bytes of them are "
        "unacknowledged (the batch that crosses it is sent). Keep it above the link's "
        "bandwidth-delay product (ack latency x upload rate).",
    )
    shard_ticket_ttl_s: float = Field(
        default=600.0,
        gt=0,
        description="Lifetime of a shard ticket: what lets a sharded run's robot upload to its "
        "buffer shard's own ingest endpoint (robots ask for a fresh one before it ends).",
    )
    shard_ingest_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description="First port of the range a sharded run's shard ingest endpoints bind on "
        "their node: each endpoint's gRPC port and, with data_plane on, its data-plane port "
        "(each the first free one, the one it had first when that is in range); a shard that "
        "finds the range full does not start. 0 = any free ports.",
    )
    shard_ingest_ports: int = Field(
        default=64,
        ge=1,
        le=1024,
        description="How many ports from shard_ingest_port the range holds (open them to the "
        "robots): two per shard a node holds with data_plane on (gRPC and ZeroMQ), one "
        "without, for every run at once.",
    )
    shard_advertise_hosts: dict[str, str] = Field(
        default_factory=dict,
        description="Node IP -> the address robots reach that node at (behind NAT, or a DNS "
        "name): a shard ingest endpoint on that node binds the node IP and tells robots this "
        "address for its gRPC and its data plane; a node not named is reached at its IP.",
    )
    call_timeout_s: float = Field(default=10.0, gt=0, description="Deadline of unary calls.")
    act_timeout_s: float = Field(default=0.5, gt=0, description="Deadline of a remote Act call.")
    stream_idle_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="A stream whose peer sends or reads nothing for this long is dropped.",
    )
    keepalive_time_s: float = Field(default=10.0, gt=0, description="HTTP/2 ping interval.")
    keepalive_timeout_s: float = Field(
        default=5.0, gt=0, description="A ping unanswered this long closes the connection."
    )
    reconnect_initial_s: float = Field(default=0.2, gt=0, description="First reconnect delay.")
    reconnect_max_s: float = Field(default=10.0, gt=0, description="Largest reconnect delay.")
    auth_cache_s: float = Field(
        default=2.0, ge=0, description="How long a credential/lease lookup is reused."
    )
    max_concurrent_streams: int = Field(
        default=1024, gt=0, description="Concurrent RPCs a server accepts."
    )
    data_plane: bool = Field(
        default=True,
        description="Bulk bytes (weight chunks, step batches) over a ZeroMQ data plane beside "
        "gRPC: servers offer one, clients take it when they can reach it (else gRPC bytes).",
    )
    data_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description="ZeroMQ data-plane port (0 = any free port, a new one at each start: fix "
        "one, e.g. 50052, to open it in a firewall or Service when binding beyond loopback).",
    )
    data_advertise_host: str | None = Field(
        default=None,
        description="Host written into data-plane offers (default: bind_host). A wildcard "
        "(0.0.0.0, ::) is dialed at the host each robot dials for gRPC; set it only where "
        "robots reach data_port at another address.",
    )
    data_plane_handshake_s: float = Field(
        default=2.0, gt=0, description="How long a client waits for the data plane to answer."
    )
    data_plane_stall_s: float = Field(
        default=2.0,
        gt=0,
        description="A weight version with no chunk on the data plane for this long is "
        "completed over gRPC (Fetch).",
    )
    weight_thread_nice: int = Field(
        default=10,
        ge=0,
        le=19,
        description="Nice value added to the threads that read, hash and delta-encode weight "
        "versions, so publishing never takes CPU from a learner on the same cores (0 = off).",
    )

    @model_validator(mode="after")
    def _range_holds_a_shard(self) -> Self:
        # One shard endpoint takes a gRPC and a data-plane port of the range.
        first, count = self.shard_ingest_port, self.shard_ingest_ports
        held = min(first + count, 65536) - first
        if first and self.data_plane and held < 2:
            raise ValueError(
                f"comms.shard_ingest_port {first} with shard_ingest_ports {count} holds {held} "
                "port, and one shard takes two (gRPC and the data plane): widen "
                "shard_ingest_ports, move shard_ingest_port down, or turn comms.data_plane off"
            )
        return self
