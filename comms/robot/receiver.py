"""Edge side of weight distribution: assemble, verify, apply atomically, report.

:class:`VersionAssembler` collects one version's chunks into a staging buffer, checking each
chunk's digest (BLAKE3, :mod:`comms.wire.weight_codec`) as it lands; a bad or missing chunk is
fetched again through ``refetch``.
:class:`WeightReceiver` turns a complete, verified payload into tensors (full, or delta onto the
version it holds) and swaps it in with one reference assignment, so :meth:`WeightReceiver.current`
only ever returns whole versions. A truncated or corrupted version is never applied.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from comms.proto import robofleet_pb2 as pb
from comms.wire import tensors as T
from comms.wire import weight_codec as W

log = logging.getLogger(__name__)

_VERIFY_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="chunk-verify")
_MAX_PENDING = 16  # chunks staged but not yet checked, per version


# refetch(version, base_version, missing chunk indices) -> the messages a Fetch call returned.
Refetch = Callable[[int, int, list[int]], Iterable[pb.WeightMessage]]


class VersionAssembler:
    """Stage one version's payload. Not thread-safe; one per source thread.

    Args:
        manifest: the version's manifest (checked with :func:`weight_codec.check_manifest`).
        max_payload_bytes: refuse larger payloads.
        on_verified: called with (chunk index, the staged chunk) once a chunk's digest
            matched, on the thread that checked it (a relay forwards chunks so, as they come);
            the view must not be written.

    Raises:
        WeightFormatError: from the constructor, when the manifest is inconsistent.
    """

    def __init__(
        self,
        manifest: pb.Manifest,
        max_payload_bytes: int = 1 << 40,
        on_verified: Callable[[int, memoryview], object] | None = None,
    ) -> None:
        W.check_manifest(manifest, max_payload_bytes)
        self.manifest = manifest
        self._on_verified = on_verified
        self.payload = self._staging_buffer(manifest.payload_bytes)
        self._digest, self._digests = W.chunk_check(manifest)
        self._missing = set(range(len(self._digests)))
        self._pending: collections.deque[tuple[int, Future[bytes]]] = collections.deque()
        self._pending_index: set[int] = set()
        self.rejected = 0  # chunks refused for a bad digest or size

    def _staging_buffer(self, nbytes: int) -> memoryview:
        """Where the version's chunks are staged. Every byte is written by a chunk before the
        version can be complete: no zero fill."""
        return T.byte_buffer(nbytes)

    def _stage(self, index: int, data: Any) -> memoryview:
        """Copy chunk ``index`` (``data``, its length checked) into the staging buffer; returns
        the staged bytes, which are what gets checked."""
        size = self.manifest.chunk_bytes
        staged = self.payload[index * size : index * size + len(data)]
        staged[:] = data
        return staged

    @property
    def key(self) -> tuple[int, int]:
        return int(self.manifest.version), int(self.manifest.base_version)

    @property
    def missing(self) -> list[int]:
        self._settle()
        return sorted(self._missing)

    @property
    def staged_all(self) -> bool:
        """Whether every chunk is staged (some may still be being checked): :attr:`complete`
        would not wait for more data, only for the checks."""
        return len(self._pending_index) == len(self._missing)

    @property
    def complete(self) -> bool:
        self._settle()
        return not self._missing

    def add_async(self, chunk: pb.Chunk) -> None:
        """Stage ``chunk`` now and check its digest on a worker thread (hashing releases the
        GIL), so hashing overlaps with receiving the next chunks. ``complete`` and ``missing``
        wait for the checks; a chunk that fails is refused as in :meth:`add`."""
        self.add_buffer(chunk.version, chunk.base_version, chunk.index, chunk.data)

    def add_buffer(self, version: int, base_version: int, index: int, data: Any) -> bool:
        """:meth:`add_async` for raw bytes (a data-plane frame): copied into the staging
        buffer, the staged copy is what gets checked. Returns whether it was staged."""
        if (version, base_version) != self.key:
            return False
        i = int(index)
        size = self.manifest.chunk_bytes
        expected_len = min(size, self.manifest.payload_bytes - i * size)
        if i >= len(self._digests) or len(data) != expected_len:
            self.rejected += 1
            return False
        if i not in self._missing or i in self._pending_index:
            return False  # a duplicate: verified (or being verified) data is never overwritten
        staged = self._stage(i, data)
        fut = _VERIFY_POOL.submit(self._digest, staged)
        if self._on_verified is not None:
            fut.add_done_callback(functools.partial(self._verified, i, staged))
        self._pending.append((i, fut))
        self._pending_index.add(i)
        if len(self._pending) > _MAX_PENDING:  # bounded memory: wait for the oldest checks
            self._settle(keep=_MAX_PENDING // 2)
        return True

    def _verified(self, i: int, staged: memoryview, fut: Future[bytes]) -> None:
        if self._on_verified is not None and fut.result() == self._digests[i]:
            self._on_verified(i, staged)

    def _settle(self, keep: int = 0) -> None:
        while len(self._pending) > keep:
            i, fut = self._pending.popleft()
            self._pending_index.discard(i)
            if fut.result() == self._digests[i]:
                self._missing.discard(i)
            else:
                self.rejected += 1
                log.warning("version %d chunk %d refused: bad digest", self.key[0], i)

    def add(self, chunk: pb.Chunk) -> bool:
        """Stage ``chunk`` if it belongs here and its digest matches; returns whether it did."""
        if (chunk.version, chunk.base_version) != self.key:
            return False
        self._settle()
        i = int(chunk.index)
        size = self.manifest.chunk_bytes
        if i >= len(self._digests):
            self.rejected += 1
            return False
        expected_len = min(size, self.manifest.payload_bytes - i * size)
        if len(chunk.data) != expected_len or (self._digest(chunk.data) != self._digests[i]):
            self.rejected += 1
            log.warning("version %d chunk %d refused: bad size or digest", chunk.version, i)
            return False
        staged = self._stage(i, chunk.data)
        self._missing.discard(i)
        if self._on_verified is not None:
            self._on_verified(i, staged)
        return True

    def repair(self, refetch: Refetch | None, attempts: int = 3) -> bool:
        """Fetch missing or refused chunks again; returns whether the version is complete."""
        for _ in range(attempts):
            if self.complete or refetch is None:
                break
            version, base = self.key
            try:
                for msg in refetch(version, base, self.missing):
                    if msg.HasField("chunk"):
                        self.add(msg.chunk)
            except Exception as exc:  # a failed refetch leaves the version unapplied
                log.info("refetch of version %d failed: %s", version, exc)
                return False
        return self.complete


class WeightReceiver:
    """Holds the applied policy weights on a robot; thread-safe.

    Args:
        as_torch: hand out ``torch.Tensor`` (sharing memory with the payload) instead of numpy.
        on_applied: called with the version number after each swap (e.g. to report it in the
            next heartbeat); runs on the applying thread.
        whole_versions: keep each applied version as one complete payload
            (:meth:`current_payload`): a delta's tensors, unchanged ones too, are written into
            one buffer (:func:`~comms.wire.weight_codec.apply_whole`). For a site relay, which
            republishes every version as it is instead of copying its tensors once more.

    Usage::

        rx = WeightReceiver(as_torch=True)
        GrpcWeightSubscription(client, run_id, rx)   # or ZmqWeightSubscription (site relay)
        version, state = rx.current()                # (-1, {}) until the first version
        policy.load_state_dict(state)                # at a safe boundary of the control loop

    The returned dict and its tensors are shared with later versions (unchanged tensors are
    reused) and must not be modified.
    """

    def __init__(
        self,
        *,
        as_torch: bool = False,
        on_applied: Callable[[int], None] | None = None,
        whole_versions: bool = False,
    ) -> None:
        self._as_torch = as_torch
        self._whole = whole_versions
        self._payload: tuple[int, int, W.Blob] | None = None
        self._on_applied = on_applied
        self._lock = threading.Lock()
        self._arrays: dict[str, tuple[str, np.ndarray]] | None = None
        self._current: tuple[int, dict[str, Any]] = (W.FULL_BASE, {})
        self._full: tuple[pb.Manifest, W.Blob] | None = None  # the applied version, if full
        self._applied = threading.Condition(self._lock)

    @property
    def version(self) -> int:
        """The applied version, -1 before the first."""
        return self._current[0]

    def current(self) -> tuple[int, dict[str, Any]]:
        """(version, {name: tensor}) of the applied version; never a half-applied one."""
        return self._current

    def current_arrays(self) -> tuple[int, dict[str, tuple[str, np.ndarray]]]:
        """(version, {name: (safetensors dtype name, read-only numpy array)}); BF16 as uint16."""
        with self._lock:
            return self._current[0], dict(self._arrays or {})

    def current_full(self) -> tuple[pb.Manifest, W.Blob] | None:
        """(manifest, payload) of the applied version when it arrived as a full version: every
        chunk checked against the manifest's digests; None before one or after a delta."""
        with self._lock:
            return self._full

    def current_payload(self) -> tuple[int, int, W.Blob] | None:
        """(version, learner step, complete safetensors payload) of the applied version, with
        ``whole_versions``: a full version as it came, a delta as applied into one buffer (the
        tensors :meth:`current_arrays` returns are views of it). None without the option or
        before the first version."""
        with self._lock:
            return self._payload

    def wait_for(self, version: int, timeout: float | None = None) -> bool:
        """Block until a version >= ``version`` is applied; returns whether it was in time."""
        with self._applied:
            return self._applied.wait_for(lambda: self._current[0] >= version, timeout)

    def new_assembler(
        self,
        manifest: pb.Manifest,
        on_verified: Callable[[int, memoryview], object] | None = None,
    ) -> VersionAssembler:
        """The assembler a subscription stages ``manifest``'s version in, for :meth:`apply`.

        Raises:
            WeightFormatError: the manifest is inconsistent.
        """
        return VersionAssembler(manifest, on_verified=on_verified)

    def wants(self, manifest: pb.Manifest) -> bool:
        """Whether ``manifest`` is newer than what is applied and applicable (full, or onto ours)."""
        if manifest.version <= self._current[0]:
            return False
        return manifest.base_version in (W.FULL_BASE, self._current[0])

    def apply(self, asm: VersionAssembler) -> bool:
        """Apply a complete version: verify, build the tensors, swap. Returns whether it did.

        Stale versions (not newer than the applied one) and deltas whose base is not the applied
        version are ignored; an inconsistent payload is logged and refused.
        """
        if not asm.complete:
            return False
        m = asm.manifest
        with self._lock:
            if not self.wants(m):
                return False
            try:
                if self._whole:
                    arrays, payload = W.apply_whole(m, asm.payload, self._arrays)
                else:
                    arrays, payload = W.apply(m, asm.payload, self._arrays), None
            except W.WeightFormatError as exc:
                log.error("refusing version %d: %s", m.version, exc)
                return False
            prev = self._current[1]
            prev_arrays = self._arrays or {}
            out: dict[str, Any] = {}
            for name, (dt, arr) in arrays.items():
                # Reuse the previous output object for unchanged tensors (no copy, same identity).
                if name in prev and prev_arrays.get(name, (None, None))[1] is arr:
                    out[name] = prev[name]
                else:
                    out[name] = T.to_output(dt, arr, self._as_torch)
            self._arrays = arrays
            self._full = (m, asm.payload) if m.base_version == W.FULL_BASE else None
            if payload is not None:
                self._payload = (int(m.version), int(m.learner_step), payload)
            self._current = (int(m.version), out)  # the one atomic swap
            self._applied.notify_all()
        if self._on_applied is not None:
            self._on_applied(int(m.version))
        return True
