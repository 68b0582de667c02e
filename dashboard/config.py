"""Dashboard settings (the ``dashboard:`` section, ``ROBOFLEET_DASHBOARD__*``) and what the
app reads of the composed settings (:class:`AppSettings`)."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, Field, field_validator

from comms.config import CommsSettings


class DashboardSettings(BaseModel):
    """HTTP API and pages."""

    bind_host: str = Field(default="127.0.0.1", description="Address the HTTP server binds to.")
    port: int = Field(default=8000, ge=0, le=65535, description="HTTP port (0 = any free port).")
    session_ttl_s: float = Field(
        default=12 * 3600.0, gt=0, description="Lifetime of a browser login session."
    )
    tls_cert_file: Path | None = Field(
        default=None, description="PEM certificate: the dashboard serves HTTPS when set."
    )
    tls_key_file: Path | None = Field(
        default=None, description="PEM private key for tls_cert_file."
    )
    cookie_secure: bool = Field(
        default=False,
        description="Mark session cookies Secure (set when the dashboard is served over HTTPS).",
    )
    login_max_failures: int = Field(
        default=5,
        ge=1,
        description="Failed logins of one user from one client per window before a 429.",
    )
    login_max_failures_per_client: int = Field(
        default=20,
        ge=1,
        description="Failed logins from one client (any usernames) per window before a 429.",
    )
    login_window_s: float = Field(
        default=300.0, gt=0, description="Sliding window of the failed-login limits, seconds."
    )
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description=(
            "Addresses or networks (CIDR) of the reverse proxies in front of the dashboard. "
            "Only a request from one of them may name its client in X-Forwarded-For (the "
            "rightmost address not in this list counts); the login throttle and the audit log "
            "key on that client. Empty: the header is ignored and the connecting address is "
            "the client (behind a proxy, set its address, or every user shares its limits)."
        ),
    )
    stream_poll_interval_s: float = Field(
        default=0.5, gt=0, description="How often live streams look for new metrics."
    )
    stream_backlog_points: int = Field(
        default=5000, ge=0, description="Metric points a new live-chart stream starts with."
    )

    @field_validator("trusted_proxies")
    @classmethod
    def _addresses_or_networks(cls, value: list[str]) -> list[str]:
        """Each entry an IP address or a network with no host bits (``10.1.0.0/16``); uvicorn
        would silently take anything else as a literal that never matches."""
        out = []
        for entry in value:
            try:
                parsed = (
                    ipaddress.ip_network(entry) if "/" in entry else ipaddress.ip_address(entry)
                )
            except ValueError as err:
                raise ValueError(f"trusted_proxies: {err} (an IP address or network)") from None
            out.append(str(parsed))
        return out


class AppSettings(Protocol):
    """What the app reads of robofleet's settings (``robofleet.settings.Settings``)."""

    @property
    def data_dir(self) -> Path: ...

    @property
    def dashboard(self) -> DashboardSettings: ...

    @property
    def comms(self) -> CommsSettings: ...

    @property
    def insecure_network(self) -> bool: ...

    def secret(self) -> str:
        """The key that signs sessions and robot credentials."""
        ...
