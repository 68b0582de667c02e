"""Fleet settings (the ``hal:`` section, ``ROBOFLEET_HAL__*``)."""

from pydantic import BaseModel, Field


class HalSettings(BaseModel):
    """Robot liveness and scheduling."""

    heartbeat_interval_s: float = Field(default=1.0, gt=0, description="How often robots report.")
    offline_after_s: float = Field(
        default=10.0, gt=0, description="A robot with no heartbeat for this long is marked offline."
    )
