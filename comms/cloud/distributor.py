"""Cloud side of weight distribution: versioned, latest-only, off the training thread.

``publish`` (called by the learner) copies the weights once into a new snapshot and returns;
an encoder thread then computes chunk digests and the delta from the previous version. Only the
newest pending snapshot is kept: if the learner publishes faster than the encoder, intermediate
versions are skipped. Servers stream :meth:`WeightDistributor.latest` to subscribers, so a slow
subscriber also skips versions. Memory held: the latest full version, its delta, at most one
pending snapshot, plus what in-flight streams still reference, whatever the publish rate.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from comms.cloud.priority import lower_this_thread
from comms.wire import tensors as T
from comms.wire import weight_codec as W

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Published:
    """One published version: the full encoding and, when cheaper, the delta from ``base``."""

    full: W.EncodedVersion
    delta: W.EncodedVersion | None

    @property
    def version(self) -> int:
        return self.full.version

    def for_subscriber(self, have_version: int) -> W.EncodedVersion:
        """What to send to a subscriber holding ``have_version``: the delta onto it, else full."""
        if self.delta is not None and self.delta.base_version == have_version:
            return self.delta
        return self.full

    def get(self, base_version: int) -> W.EncodedVersion | None:
        if base_version == W.FULL_BASE:
            return self.full
        if self.delta is not None and self.delta.base_version == base_version:
            return self.delta
        return None


class WeightDistributor:
    """Distributes one run's policy weights: versions published here are streamed to robots.

    Args:
        run_id: the run these weights belong to (written into every manifest).
        chunk_bytes: chunk size, at most 1 MiB.
        use_delta: send deltas when they are smaller than the full version.
        thread_nice: lower the encoder thread's OS priority by this much (see
            :mod:`comms.cloud.priority`); the hashing threads it starts inherit it.

    Usage (learner)::

        dist = server.distributor(run_id)         # or WeightDistributor(run_id) for a relay/test
        v = dist.publish(policy.state_dict(), learner_step=step)  # returns at once
    """

    def __init__(
        self,
        run_id: str,
        chunk_bytes: int = W.MAX_CHUNK_BYTES,
        *,
        use_delta: bool = True,
        thread_nice: int = 0,
    ) -> None:
        if not 0 < chunk_bytes <= W.MAX_CHUNK_BYTES:
            raise ValueError(f"chunk_bytes must be in 1..{W.MAX_CHUNK_BYTES}, got {chunk_bytes}")
        self.run_id = run_id
        self.chunk_bytes = chunk_bytes
        self.use_delta = use_delta
        self._cond = threading.Condition()
        self._pending: W.Snapshot | None = None
        self._encoding = False  # a snapshot taken off _pending is being encoded
        self._last_version = W.FULL_BASE
        self._base: W.Snapshot | None = None  # the latest encoded snapshot (delta base)
        self._latest: Published | None = None
        self._listeners: list[Callable[[Published], None]] = []
        self._closed = False
        self.skipped = 0  # snapshots replaced before they were encoded
        self._thread_nice = thread_nice
        self._thread = threading.Thread(target=self._run, name=f"weights-{run_id}", daemon=True)
        self._thread.start()

    # -- learner side ------------------------------------------------------------------------

    def publish(
        self, state: Mapping[str, Any], version: int | None = None, learner_step: int = 0
    ) -> int:
        """Snapshot ``state`` (name -> torch tensor or numpy array) as a new version.

        Costs one copy of the weights on the calling thread; digests and deltas are computed on
        the distributor's own thread.

        Returns:
            The version number (``version``, or one above the last).

        Raises:
            ValueError: ``version`` is not above the last published one.
            TypeError: a value is not a tensor or has an unsupported dtype.
        """
        v = self._next_version(version)
        self._enqueue(W.Snapshot.take(state, v, learner_step))
        return v

    def publish_safetensors(
        self,
        blob: W.Blob,
        version: int | None = None,
        learner_step: int = 0,
        digests: tuple[int, list[bytes]] | None = None,
    ) -> int:
        """Publish a safetensors blob as it is (no copy), e.g. a file the learner wrote.

        ``blob`` is owned by the distributor afterwards and must not be modified. ``digests``
        (chunk size, BLAKE3 of each chunk of ``blob``), when given, must have been checked
        against ``blob`` (a relay's verified version): it is not hashed again.

        Returns:
            The version number.

        Raises:
            ValueError: ``version`` is not above the last published one.
            TensorFormatError: ``blob`` is not a valid safetensors blob.
        """
        arrays = T.decode(blob)
        v = self._next_version(version)
        self._enqueue(W.Snapshot(v, blob, arrays, learner_step, digests))
        return v

    def _next_version(self, version: int | None) -> int:
        with self._cond:
            v = self._last_version + 1 if version is None else int(version)
            if v <= self._last_version:
                raise ValueError(
                    f"version {v} is not above the last published {self._last_version}"
                )
            self._last_version = v
            return v

    def _enqueue(self, snap: W.Snapshot) -> None:
        with self._cond:
            if self._pending is not None:
                self.skipped += 1
            self._pending = snap  # latest-only: an older pending snapshot is dropped
            self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every published version is encoded; returns whether it was in time."""
        with self._cond:
            # Between taking a snapshot and storing its encoding, _pending is already None:
            # the _encoding flag keeps flush from returning in that window.
            return self._cond.wait_for(
                lambda: self._pending is None and not self._encoding, timeout
            )

    # -- server side -------------------------------------------------------------------------

    def latest(self) -> Published | None:
        """The newest encoded version, or None before the first."""
        return self._latest

    @property
    def last_version(self) -> int:
        """The newest version handed to :meth:`publish` (encoded or not yet); -1 before any."""
        with self._cond:
            return self._last_version

    def add_listener(self, fn: Callable[[Published], None]) -> None:
        """Call ``fn(published)`` on the encoder thread after each new version (keep it short)."""
        with self._cond:
            self._listeners.append(fn)

    def wait_newer(self, have_version: int, timeout: float | None = None) -> Published | None:
        """Block until a version above ``have_version`` is encoded; None on timeout or close."""
        with self._cond:
            self._cond.wait_for(
                lambda: (
                    self._closed
                    or (self._latest is not None and self._latest.version > have_version)
                ),
                timeout,
            )
            latest = self._latest
        return latest if latest is not None and latest.version > have_version else None

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        lower_this_thread(self._thread_nice)
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or self._pending is not None)
                if self._closed:
                    return
                snap, self._pending = self._pending, None
                self._encoding = True
            assert snap is not None
            try:
                full = W.encode_full(self.run_id, snap, self.chunk_bytes)
                delta = None
                if self.use_delta and self._base is not None:
                    try:
                        delta = W.encode_delta(self.run_id, self._base, snap, self.chunk_bytes)
                    except W.WeightFormatError as exc:
                        log.info("version %d sent full only: %s", snap.version, exc)
            except Exception:
                log.exception("encoding version %d failed; it is skipped", snap.version)
                with self._cond:
                    self._encoding = False
                    self._cond.notify_all()
                continue
            pub = Published(full, delta)
            with self._cond:
                self._encoding = False
                self._base = snap
                self._latest = pub
                listeners = list(self._listeners)
                self._cond.notify_all()
            for fn in listeners:
                try:
                    fn(pub)
                except Exception:
                    log.exception("weight listener failed")
