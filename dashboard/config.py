"""Dashboard settings (the ``dashboard:`` section, ``ROBOFLEET_DASHBOARD__*``)."""

from pydantic import BaseModel, Field


class DashboardSettings(BaseModel):
    """HTTP API and pages."""

    bind_host: str = Field(default="127.0.0.1", description="Address the HTTP server binds to.")
    port: int = Field(default=8000, ge=0, le=65535, description="HTTP port (0 = any free port).")
