"""Who is calling: robot credentials and leases, looked up in the metadata store.

Every call except enrollment carries ``authorization: Bearer <credential>``. A robot may upload
only as itself and only into runs it holds an active lease on. Lookups are cached for a short
time (``auth_cache_s``) so a busy stream does not hit the database per message; a revoked
credential stops working within that time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from comms.wire.credentials import credential_from
from foundation.store.metadata_store import MetadataStore


class AuthError(PermissionError):
    """Refused call. ``unauthenticated`` distinguishes a bad credential from a missing right."""

    def __init__(self, message: str, *, unauthenticated: bool) -> None:
        super().__init__(message)
        self.unauthenticated = unauthenticated


@dataclass(frozen=True)
class RobotIdentity:
    """The authenticated caller."""

    robot_id: int
    name: str
    robot_type: str


Metadata = Sequence[tuple[str, str | bytes]]


class CallerAuth(Protocol):
    """Who may call a server's services: the cloud's :class:`Authenticator` (credentials and
    leases) or a buffer shard's ticket check (``comms.cloud.shard_ingest``)."""

    def identify_call(self, metadata: Metadata | None) -> RobotIdentity:
        """The robot a call's metadata authenticates.

        Raises:
            AuthError: (unauthenticated) the metadata authenticates no robot (the reason).
        """
        ...

    def require_lease(self, ident: RobotIdentity, run_id: str) -> None:
        """Raises AuthError (permission denied) unless ``ident`` may act in ``run_id``."""
        ...


class Authenticator:
    """Resolves credentials and checks leases against the metadata store (thread-safe, blocking)."""

    def __init__(self, store: MetadataStore, cache_s: float = 2.0) -> None:
        self._store = store
        self._cache_s = cache_s
        self._lock = threading.Lock()
        self._robots: dict[str, tuple[float, RobotIdentity | None]] = {}
        self._leases: dict[str, tuple[float, frozenset[int]]] = {}

    def identify(self, credential: str | None) -> RobotIdentity:
        """The robot holding ``credential``.

        Raises:
            AuthError: (unauthenticated) no credential, or unknown or revoked.
        """
        if not credential:
            raise AuthError(
                "missing robot credential (authorization: Bearer ...)", unauthenticated=True
            )
        now = time.monotonic()
        with self._lock:
            hit = self._robots.get(credential)
        if hit is None or now - hit[0] > self._cache_s:
            robot = self._store.robot_for_credential(credential)
            ident = None if robot is None else RobotIdentity(robot.id, robot.name, robot.robot_type)
            hit = (now, ident)
            with self._lock:
                if len(self._robots) > 100_000:
                    self._robots.clear()
                self._robots[credential] = hit
        if hit[1] is None:
            raise AuthError("unknown or revoked robot credential", unauthenticated=True)
        return hit[1]

    def identify_call(self, metadata: Metadata | None) -> RobotIdentity:
        """:meth:`identify` of the bearer credential in a call's ``metadata``."""
        return self.identify(credential_from(metadata))

    def require_lease(self, ident: RobotIdentity, run_id: str) -> None:
        """Raises AuthError (permission denied) unless ``ident`` holds an active lease on ``run_id``."""
        if not run_id:
            raise AuthError("run_id is required", unauthenticated=False)
        now = time.monotonic()
        with self._lock:
            hit = self._leases.get(run_id)
        if hit is None or now - hit[0] > self._cache_s or ident.robot_id not in hit[1]:
            # A miss is re-checked at once so a fresh lease works without waiting for the cache.
            robots = frozenset(lease.robot_id for lease in self._store.active_leases(run_id))
            hit = (now, robots)
            with self._lock:
                self._leases[run_id] = hit
        if ident.robot_id not in hit[1]:
            raise AuthError(
                f"robot {ident.name} holds no active lease on run {run_id!r}", unauthenticated=False
            )

    def invalidate(self) -> None:
        """Forget cached lookups (after a revocation or lease change)."""
        with self._lock:
            self._robots.clear()
            self._leases.clear()
