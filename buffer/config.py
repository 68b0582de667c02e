"""Buffer settings (the ``buffer:`` section of robofleet.yaml, ``ROBOFLEET_BUFFER__*``)."""

from pydantic import BaseModel, Field


class BufferSettings(BaseModel):
    """Where and how the replay buffer keeps steps.

    Sizes are bytes; durations are seconds.
    """

    memory_budget_bytes: int = Field(
        default=2 * 1024**3, gt=0, description="Byte budget of the in-memory hot tier."
    )
    segment_target_bytes: int = Field(
        default=64 * 1024**2,
        gt=0,
        description="A WAL is sealed into an Arrow segment near this size.",
    )
    group_commit_max_delay_s: float = Field(
        default=0.002, ge=0, description="Longest an append waits for others to share one fsync."
    )
    max_record_bytes: int = Field(
        default=16 * 1024**2, gt=0, description="A single step larger than this is rejected."
    )
