"""Edge agent settings (the ``edge:`` section, ``ROBOFLEET_EDGE__*``)."""

from pydantic import BaseModel, Field


class EdgeSettings(BaseModel):
    """Control loop, HG-DAgger gating and the offline spool."""

    spool_max_bytes: int = Field(
        default=1024**3, gt=0, description="Upper bound of the on-disk spool."
    )
    gating_threshold: float = Field(
        default=0.3, gt=0, description="Operator takes over when |novice - expert| exceeds this."
    )
    handback_steps: int = Field(
        default=5, ge=1, description="Agreeing steps before the operator hands control back."
    )
