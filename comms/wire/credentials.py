"""A robot's credential in gRPC call metadata: ``authorization: Bearer <credential>``."""

from __future__ import annotations

from collections.abc import Sequence

AUTH_HEADER = "authorization"
BEARER = "Bearer "


def credential_metadata(credential: str) -> tuple[tuple[str, str], ...]:
    """gRPC call metadata carrying ``credential``."""
    return ((AUTH_HEADER, BEARER + credential),)


def credential_from(metadata: Sequence[tuple[str, str | bytes]] | None) -> str | None:
    """The bearer credential in call metadata, or None."""
    for key, value in metadata or ():
        if key == AUTH_HEADER:
            v = value.decode() if isinstance(value, bytes) else value
            return v[len(BEARER) :].strip() if v.startswith(BEARER) else None
    return None
