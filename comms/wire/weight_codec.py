"""Weight versions on the wire: manifest + safetensors payload in chunks of at most 1 MiB.

A *full* version carries every tensor. A *delta* carries, per changed tensor, either the whole
tensor (``FULL``) or sparse element deltas (``SPARSE``: ``<name>::idx`` int32/int64 flat indices
and ``<name>::val`` new values), whichever is smaller; unchanged tensors are omitted. A delta is
used only when it is smaller than the full version. Elements are compared bit for bit, so a NaN
that stays NaN is unchanged and ``-0.0`` vs ``0.0`` is a change.

Each chunk is bound to the manifest by its BLAKE3 digest (https://github.com/BLAKE3-team/BLAKE3,
32 bytes, ``Manifest.chunk_blake3``): a cryptographic hash several times faster than SHA-256
per core, chosen because hashing is a large part of a push, once on the publisher and once on
every robot. Manifests that carry SHA-256 digests (``chunk_sha256``) instead are checked with
those.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import blake3
import numpy as np

from comms.proto import robofleet_pb2 as pb
from comms.wire import payload_messages
from comms.wire import tensors as T

MAX_CHUNK_BYTES = 1024 * 1024
Blob = bytes | bytearray | memoryview  # a payload: contiguous bytes (a memoryview of format "B")
FULL_BASE = -1
IDX_SUFFIX = "::idx"
VAL_SUFFIX = "::val"


class WeightFormatError(ValueError):
    """A manifest or payload is inconsistent (sizes, digests, names, shapes, base version)."""


@dataclass(frozen=True)
class Snapshot:
    """A full version as the publisher holds it: the payload blob and zero-copy views into it.

    ``arrays`` maps name -> (dtype name, array view of ``payload``); ``payload`` is a complete
    safetensors blob (the bytes of a full version), read-only from here on.
    """

    version: int
    payload: Blob
    arrays: dict[str, tuple[str, np.ndarray]]
    learner_step: int = 0
    # (chunk size, BLAKE3 of each chunk of ``payload``) when already known and checked, e.g. a
    # relay republishing a version it verified: its full encoding then hashes nothing.
    digests: tuple[int, list[bytes]] | None = None

    @classmethod
    def take(cls, state: Mapping[str, Any], version: int, learner_step: int = 0) -> Snapshot:
        """Copy ``state`` (name -> numpy array or torch tensor) once into a new payload blob:
        each tensor's buffer straight into place (:func:`comms.wire.tensors.encode`)."""
        payload = T.encode(state)
        return cls(version, payload, T.decode(payload), learner_step)


@dataclass
class EncodedVersion:
    """A version ready to send: its manifest and payload (full or delta)."""

    manifest: pb.Manifest
    payload: Blob
    _mv: memoryview = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._mv = memoryview(self.payload)

    @property
    def version(self) -> int:
        return int(self.manifest.version)

    @property
    def base_version(self) -> int:
        return int(self.manifest.base_version)

    @property
    def num_chunks(self) -> int:
        return len(chunk_check(self.manifest)[1])

    def chunk(self, index: int) -> bytes:
        size = self.manifest.chunk_bytes
        return bytes(self._mv[index * size : (index + 1) * size])

    def chunk_view(self, index: int) -> memoryview:
        """Chunk ``index`` without a copy."""
        size = self.manifest.chunk_bytes
        return self._mv[index * size : (index + 1) * size]

    def chunk_wire(self, index: int) -> bytes:
        """Chunk ``index`` as a serialized ``pb.WeightMessage`` (one copy of the data)."""
        return payload_messages.weight_chunk(
            self.version, self.base_version, index, self.chunk_view(index)
        )

    def chunk_message(self, index: int) -> pb.WeightMessage:
        return pb.WeightMessage(
            chunk=pb.Chunk(
                version=self.version,
                base_version=self.base_version,
                index=index,
                data=self.chunk(index),
            )
        )


_HASH_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="chunk-digest")
_PARALLEL_FROM = 8 * MAX_CHUNK_BYTES


def blake3_digest(data: Any) -> bytes:
    """The 32-byte BLAKE3 digest of a buffer (the GIL is released while hashing)."""
    return blake3.blake3(data).digest()


def sha256_digest(data: Any) -> bytes:
    return hashlib.sha256(data).digest()


def chunk_check(m: pb.Manifest) -> tuple[Callable[[Any], bytes], Sequence[bytes]]:
    """The digest function of ``m``'s chunks and their expected digests: BLAKE3, or SHA-256
    for a manifest that carries only those."""
    if m.chunk_sha256 and not m.chunk_blake3:
        return sha256_digest, m.chunk_sha256
    return blake3_digest, m.chunk_blake3


def chunk_digests(payload: Blob, chunk_bytes: int) -> list[bytes]:
    """BLAKE3 of each ``chunk_bytes`` slice of ``payload``.

    The GIL is released while hashing, so big payloads are hashed on two threads, which
    shortens the wait before a version can be sent.
    """
    mv = memoryview(payload)

    def one(i: int) -> bytes:
        return blake3_digest(mv[i : i + chunk_bytes])

    starts = range(0, len(mv), chunk_bytes)
    if len(mv) < _PARALLEL_FROM:
        return [one(i) for i in starts]
    return list(_HASH_POOL.map(one, starts))


def _manifest(
    run_id: str,
    version: int,
    base: int,
    entries: list[pb.TensorEntry],
    changed: list[str],
    payload: Blob,
    chunk_bytes: int,
    learner_step: int,
    digests: list[bytes] | None = None,
) -> pb.Manifest:
    if not 0 < chunk_bytes <= MAX_CHUNK_BYTES:
        raise ValueError(f"chunk_bytes must be in 1..{MAX_CHUNK_BYTES}, got {chunk_bytes}")
    return pb.Manifest(
        run_id=run_id,
        version=version,
        base_version=base,
        tensors=entries,
        changed=changed,
        payload_bytes=len(payload),
        chunk_bytes=chunk_bytes,
        chunk_blake3=chunk_digests(payload, chunk_bytes) if digests is None else digests,
        learner_step=learner_step,
    )


def encode_full(run_id: str, snap: Snapshot, chunk_bytes: int = MAX_CHUNK_BYTES) -> EncodedVersion:
    """The full version of ``snap`` (its payload is sent as is; only digests are computed,
    unless the snapshot carries them for this chunk size)."""
    entries = [
        pb.TensorEntry(name=k, dtype=dt, shape=list(a.shape)) for k, (dt, a) in snap.arrays.items()
    ]
    known = snap.digests[1] if snap.digests and snap.digests[0] == chunk_bytes else None
    m = _manifest(
        run_id,
        snap.version,
        FULL_BASE,
        entries,
        [],
        snap.payload,
        chunk_bytes,
        snap.learner_step,
        known,
    )
    return EncodedVersion(m, snap.payload)


def encode_delta(
    run_id: str, base: Snapshot, new: Snapshot, chunk_bytes: int = MAX_CHUNK_BYTES
) -> EncodedVersion | None:
    """The delta from ``base`` to ``new``, or None when it would not be smaller than the full.

    Raises:
        WeightFormatError: the two snapshots do not hold the same names, dtypes and shapes.
    """
    if base.arrays.keys() != new.arrays.keys():
        raise WeightFormatError("delta needs the same tensor names in base and new version")
    parts: dict[str, np.ndarray | tuple[str, np.ndarray]] = {}
    entries: list[pb.TensorEntry] = []
    changed: list[str] = []
    budget = len(new.payload)
    for name, (dt, arr) in new.arrays.items():
        bdt, barr = base.arrays[name]
        if bdt != dt or barr.shape != arr.shape:
            raise WeightFormatError(f"tensor {name!r} changed dtype or shape; send a full version")
        entry = pb.TensorEntry(name=name, dtype=dt, shape=list(arr.shape))
        entries.append(entry)
        bits = np.dtype(f"u{arr.dtype.itemsize}") if arr.dtype.itemsize > 1 else np.dtype("u1")
        flat_new = arr.reshape(-1).view(bits)
        diff = np.flatnonzero(flat_new != barr.reshape(-1).view(bits))
        if diff.size == 0:
            continue
        changed.append(name)
        idx_dtype = np.int32 if arr.size < 2**31 else np.int64
        sparse = diff.size * (np.dtype(idx_dtype).itemsize + arr.dtype.itemsize)
        if sparse < arr.nbytes:
            entry.encoding = pb.TensorEntry.SPARSE
            parts[name + IDX_SUFFIX] = diff.astype(idx_dtype)
            parts[name + VAL_SUFFIX] = (dt, arr.reshape(-1)[diff])
        else:
            parts[name] = (dt, arr)
        if (
            sum(p.nbytes if isinstance(p, np.ndarray) else p[1].nbytes for p in parts.values())
            >= budget
        ):
            return None
    payload = T.encode(parts)
    if len(payload) >= budget:
        return None
    m = _manifest(
        run_id, new.version, base.version, entries, changed, payload, chunk_bytes, new.learner_step
    )
    return EncodedVersion(m, payload)


def check_manifest(m: pb.Manifest, max_payload_bytes: int = 1 << 40) -> None:
    """Refuse a manifest whose sizes cannot be right, before any chunk is accepted.

    Raises:
        WeightFormatError: chunk size over 1 MiB or zero, digest count or length wrong (or
            both kinds of digest), payload too large, tensor entries with unknown dtypes or
            negative shapes.
    """
    if not 0 < m.chunk_bytes <= MAX_CHUNK_BYTES:
        raise WeightFormatError(f"chunk_bytes {m.chunk_bytes} outside 1..{MAX_CHUNK_BYTES}")
    if m.payload_bytes > max_payload_bytes:
        raise WeightFormatError(f"payload of {m.payload_bytes} bytes exceeds {max_payload_bytes}")
    expected = -(-m.payload_bytes // m.chunk_bytes)
    if m.chunk_sha256 and m.chunk_blake3:
        raise WeightFormatError(f"version {m.version}: both SHA-256 and BLAKE3 chunk digests")
    digests = chunk_check(m)[1]
    if len(digests) != expected:
        raise WeightFormatError(
            f"version {m.version}: {len(digests)} digests for {expected} chunks"
        )
    if any(len(d) != 32 for d in digests):
        raise WeightFormatError(f"version {m.version}: a chunk digest is not 32 bytes")
    for e in m.tensors:
        if e.dtype not in T.DTYPES or any(s < 0 for s in e.shape):
            raise WeightFormatError(f"tensor {e.name!r}: dtype {e.dtype} / shape {list(e.shape)}")


Arrays = dict[str, tuple[str, np.ndarray]]


def apply(m: pb.Manifest, payload: Blob, base: Arrays | None) -> Arrays:
    """The tensors of version ``m.version`` from a verified payload (and the base for a delta).

    Full tensors are zero-copy views of ``payload``; a delta reuses the base's arrays for
    unchanged tensors and copies only tensors with sparse updates. Nothing is modified in place,
    so readers of the base version are never disturbed. The copies go into one buffer laid out
    as the full version's payload (:func:`comms.wire.tensors.byte_buffer`), so on a robot they
    land in the buffer its previous version freed, not in new memory beside it.

    Raises:
        WeightFormatError: payload and manifest disagree, or a delta's base is missing.
    """
    return _apply(m, payload, base, whole=False)[0]


def apply_whole(m: pb.Manifest, payload: Blob, base: Arrays | None) -> tuple[Arrays, Blob]:
    """:func:`apply`, and the version's complete safetensors payload (what its full encoding
    would be, byte for byte): ``payload`` for a full version; for a delta, every tensor is
    written into the one buffer (unchanged ones too), whose arrays are returned. For a relay,
    which republishes each version as it is, with no further copy.

    Raises:
        WeightFormatError: as :func:`apply`.
    """
    out, copies = _apply(m, payload, base, whole=True)
    return out, payload if m.base_version == FULL_BASE else copies.blob()


def _apply(
    m: pb.Manifest, payload: Blob, base: Arrays | None, whole: bool
) -> tuple[Arrays, _DeltaCopies]:
    try:
        parts = T.decode(payload)
    except T.TensorFormatError as exc:
        raise WeightFormatError(f"version {m.version}: {exc}") from None
    out: dict[str, tuple[str, np.ndarray]] = {}
    changed = set(m.changed)
    copies = _DeltaCopies(m)
    for e in m.tensors:
        shape = tuple(e.shape)
        if m.base_version == FULL_BASE or e.name in changed and e.encoding == pb.TensorEntry.FULL:
            got = parts.get(e.name)
            if got is None or got[0] != e.dtype or got[1].shape != shape:
                raise WeightFormatError(f"version {m.version}: tensor {e.name!r} missing or wrong")
            full = whole and m.base_version != FULL_BASE
            out[e.name] = (e.dtype, copies.of(e.name, got[1])) if full else got
            continue
        if base is None:
            raise WeightFormatError(f"version {m.version} is a delta but no base is held")
        if e.name not in base or base[e.name][0] != e.dtype or base[e.name][1].shape != shape:
            raise WeightFormatError(f"delta tensor {e.name!r} does not match the base version")
        if e.name not in changed:
            out[e.name] = (e.dtype, copies.of(e.name, base[e.name][1])) if whole else base[e.name]
            continue
        idx = parts.get(e.name + IDX_SUFFIX)
        val = parts.get(e.name + VAL_SUFFIX)
        if idx is None or val is None or idx[1].shape != val[1].shape or val[0] != e.dtype:
            raise WeightFormatError(f"version {m.version}: sparse parts of {e.name!r} are wrong")
        arr = copies.of(e.name, base[e.name][1])
        flat = arr.reshape(-1)
        if idx[1].size and (int(idx[1].min()) < 0 or int(idx[1].max()) >= flat.size):
            raise WeightFormatError(f"version {m.version}: sparse index out of range in {e.name!r}")
        flat[idx[1]] = val[1]
        out[e.name] = (e.dtype, arr)
    return out, copies


class _DeltaCopies:
    """Where :func:`apply` copies a delta's tensors: one buffer with the full version's layout
    (the size of a full payload, which the buffer pool keeps), allocated at the first copy;
    only the copied tensors' bytes are ever written or read."""

    def __init__(self, m: pb.Manifest) -> None:
        self._m = m
        self._buf: np.ndarray | None = None
        self._offsets: dict[str, int] = {}

    def _buffer(self) -> np.ndarray:
        if self._buf is None:
            head, self._offsets = T.layout(
                {e.name: (e.dtype, tuple(e.shape)) for e in self._m.tensors}
            )
            total = len(head) + sum(
                int(np.prod(tuple(e.shape), dtype=np.int64)) * T.DTYPES[e.dtype].itemsize
                for e in self._m.tensors
            )
            self._buf = np.frombuffer(T.byte_buffer(total), dtype=np.uint8)
            self._buf[: len(head)] = np.frombuffer(head, dtype=np.uint8)
        return self._buf

    def of(self, name: str, src: np.ndarray) -> np.ndarray:
        """A copy of ``src`` (tensor ``name``, as the base or the payload holds it) in the
        buffer."""
        buf = self._buffer()
        start = self._offsets[name]
        dst = buf[start : start + src.nbytes].view(src.dtype).reshape(src.shape)
        np.copyto(dst, src)
        return dst

    def blob(self) -> memoryview:
        """The whole buffer: a complete payload once every tensor was copied into it."""
        return memoryview(self._buffer())
