"""Buffer settings (the ``buffer:`` section of robofleet.yaml, ``ROBOFLEET_BUFFER__*``)."""

from pydantic import BaseModel, Field


class BufferSettings(BaseModel):
    """Where and how the replay buffer keeps steps.

    Sizes are bytes; durations are seconds. ``0`` for a capacity or retention limit means
    "unbounded".
    """

    memory_budget_bytes: int = Field(
        default=2 * 1024**3,
        gt=0,
        description="Byte budget of payload memory: hot tier + open tail + resident cold pages.",
    )
    hot_fraction: float = Field(
        default=0.8,
        gt=0,
        lt=1,
        description="Share of the budget the hot tier may hold; the rest is for cold mmap pages.",
    )
    segment_target_bytes: int = Field(
        default=64 * 1024**2,
        gt=0,
        description="A WAL is sealed into an Arrow segment near this size.",
    )
    group_commit_max_delay_s: float = Field(
        default=0.002, ge=0, description="Longest an append waits for others to share one fsync."
    )
    wal_stripes: int = Field(
        default=4,
        ge=1,
        le=64,
        description="WAL files written in parallel (concurrent fdatasyncs); rows stay ordered.",
    )
    max_record_bytes: int = Field(
        default=16 * 1024**2, gt=0, description="A single step larger than this is rejected."
    )
    require_final_observation: bool = Field(
        default=True,
        description=(
            "A terminated or truncated step must carry its real final observation "
            "(``next.observation.*``); False falls back to repeating its own observation."
        ),
    )
    capacity_transitions: int = Field(
        default=0, ge=0, description="Online sampling window in transitions (FIFO); 0 = all."
    )
    capacity_bytes: int = Field(
        default=0, ge=0, description="Online sampling window in payload bytes (FIFO); 0 = all."
    )
    retention_max_bytes: int = Field(
        default=0,
        ge=0,
        description="Delete the oldest sealed segments beyond this many bytes on disk; 0 = keep all.",
    )
    prefetch: bool = Field(
        default=True, description="Promote frequently sampled cold segments in the background."
    )
    prefetch_interval_s: float = Field(
        default=0.05, gt=0, description="How often the prefetch thread looks for work."
    )
    shard_resource: str = Field(
        default="",
        description="Ray custom resource each shard actor of a sharded run takes one unit of, "
        "so shards are placed only on nodes that advertise it (a node started with "
        '{"robofleet/buffer": 8} holds up to 8 shards). Empty: any node.',
    )
    shard_batch_host: str = Field(
        default="127.0.0.1",
        description="Where a shard's batch server (what the learner samples) listens: "
        "127.0.0.1 when the shards run on the learner's node; 'node' for the shard node's IP "
        "as Ray knows it, when they run on other nodes (keep that on the cluster network: "
        "every request must carry the run's random batch token, which only the cloud, the "
        "shards and the learner get, but batches cross the network unencrypted, as Ray's "
        "object transfers do).",
    )
