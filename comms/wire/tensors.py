"""Tensors as raw bytes: dtype names and the safetensors layout (header + data), never pickle.

The layout is https://github.com/huggingface/safetensors (8-byte little-endian header length,
JSON header ``{name: {dtype, shape, data_offsets}}``, data). Encoding copies each tensor once
into a buffer from :func:`byte_buffer` (never zero-filled first), so it costs one ``memcpy`` of
the model.
"""

from __future__ import annotations

import json
import os
import struct
import threading
import weakref
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

# safetensors dtype name -> numpy dtype (little-endian). BF16 travels as its raw 2 bytes.
DTYPES: dict[str, np.dtype[Any]] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
_NP_TO_NAME = {v: k for k, v in DTYPES.items() if k != "BF16"}
_ALIGN = 8


class TensorFormatError(ValueError):
    """Bytes or a header do not describe valid tensors (wrong dtype, shape, offsets)."""


def as_array(value: Any) -> tuple[np.ndarray, str]:
    """A C-contiguous little-endian numpy view of a numpy array or torch tensor, and its dtype name.

    ``value`` may also be a ``(dtype name, array)`` pair as :func:`decode` returns it.

    Raises:
        TypeError: ``value`` is neither, or its dtype has no safetensors name.
    """
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], np.ndarray):
        # (dtype name, array) as :func:`decode` returns it; keeps BF16 (held as uint16) BF16.
        name, arr = value
        if name not in DTYPES or np.dtype(arr.dtype) != DTYPES[name].newbyteorder("="):
            raise TypeError(f"array of dtype {arr.dtype} cannot travel as {name!r}")
        return np.ascontiguousarray(arr), name
    if isinstance(value, np.ndarray):
        arr = value
    elif hasattr(value, "detach") and hasattr(value, "numpy"):
        t = value.detach()
        if str(t.dtype) == "torch.bfloat16":
            import torch

            return np.ascontiguousarray(t.cpu().view(torch.int16).numpy()).view("<u2"), "BF16"
        arr = t.cpu().numpy()
    else:
        raise TypeError(f"expected a numpy array or torch tensor, got {type(value).__name__}")
    dt = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
    name = _NP_TO_NAME.get(np.dtype(dt))
    if name is None:
        raise TypeError(f"dtype {arr.dtype} cannot travel (allowed: {', '.join(DTYPES)})")
    return np.ascontiguousarray(arr, dtype=dt), name


def layout(entries: Mapping[str, tuple[str, tuple[int, ...]]]) -> tuple[bytes, dict[str, int]]:
    """The safetensors header for ``{name: (dtype, shape)}`` and each tensor's data offset.

    Returns:
        (header bytes including the 8-byte length prefix, {name: absolute offset in the blob}).
    """
    header: dict[str, Any] = {}
    offsets: dict[str, int] = {}
    pos = 0
    for name, (dtype, shape) in entries.items():
        n = int(np.prod(shape, dtype=np.int64)) * DTYPES[dtype].itemsize
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, pos + n]}
        offsets[name] = pos
        pos += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(len(raw) + 8) % _ALIGN)
    prefix = struct.pack("<Q", len(raw)) + raw
    return prefix, {k: v + len(prefix) for k, v in offsets.items()}


POOL_MIN_BYTES = 1 << 20  # smaller buffers come straight from numpy
POOL_MEMORY_FRACTION = 0.25  # free buffers kept, all sizes together: this share of the RAM
POOL_PER_SIZE = 2  # free + in-use buffers of one size kept at least (a robot: applied + next)


def _physical_memory() -> int:
    """Bytes of RAM of this machine (4 GiB when the OS does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 4 << 30


class _BufferPool:
    """Free weight buffers kept for the next version of the same size.

    A robot receives, and a distributor publishes, version after version of one size; a
    buffer over glibc's mmap threshold (32 MiB at most) is returned to the kernel when freed
    and the next one is faulted in and zeroed page by page again, which can cost more than
    the copy that fills it (more still on a VM whose host reclaims freed pages).

    Kept per size: up to the most buffers of that size ever in use at once (at least
    ``POOL_PER_SIZE``), so a process's working set (a robot: the applied version and the one
    arriving; a cloud: each run's snapshots; several receivers in one process: each one's)
    stays mapped, and nothing past it. A size handed out only once so far (a received
    delta's) is not kept: sizes that do not recur would only hold memory. All sizes together
    are capped at ``max_bytes`` (``POOL_MEMORY_FRACTION`` of the RAM by default: a
    3B-parameter BF16 policy is 6 GB a version). A handed out buffer is an ndarray view of a
    pooled one; when the view and everything made from it (memoryviews, arrays, tensors) are
    gone, the pooled buffer is kept again, so a buffer is never reused while anything can
    still read it.
    """

    def __init__(self, max_bytes: int | None = None) -> None:
        self.max_bytes = (
            int(_physical_memory() * POOL_MEMORY_FRACTION) if max_bytes is None else max_bytes
        )
        self._lock = threading.Lock()
        self._free: dict[int, list[np.ndarray]] = {}
        self._in_use: dict[int, int] = {}
        self._peak: dict[int, int] = {}  # most buffers of a size in use at once
        self._takes: dict[int, int] = {}  # buffers of a size handed out so far
        self._bytes = 0

    @property
    def free_bytes(self) -> int:
        """Bytes held in free buffers."""
        return self._bytes

    def take(self, nbytes: int) -> memoryview:
        with self._lock:
            free = self._free.get(nbytes)
            raw = free.pop() if free else None
            if raw is not None:
                self._bytes -= nbytes
            used = self._in_use[nbytes] = self._in_use.get(nbytes, 0) + 1
            self._takes[nbytes] = self._takes.get(nbytes, 0) + 1
            self._peak[nbytes] = max(self._peak.get(nbytes, 0), used)
        if raw is None:
            raw = np.empty(nbytes, dtype=np.uint8)
        view = raw[:]
        weakref.finalize(view, self._keep, raw).atexit = False
        return memoryview(view)

    def _keep(self, raw: np.ndarray) -> None:
        n = raw.nbytes
        with self._lock:
            self._in_use[n] -= 1
            if self._takes[n] < 2:  # a size seen once (a delta's) is not kept
                if len(self._takes) > _POOL_SIZES_COUNTED:
                    self._forget_idle_sizes()
                return
            free = self._free.setdefault(n, [])
            working_set = max(POOL_PER_SIZE, self._peak[n])
            if len(free) + self._in_use[n] < working_set and self._bytes + n <= self.max_bytes:
                free.append(raw)
                self._bytes += n

    def release(self) -> int:
        """Drop every free buffer (they go back to the OS once unreferenced); returns their
        bytes."""
        with self._lock:
            freed, self._bytes = self._bytes, 0
            self._free.clear()
        return freed

    def _forget_idle_sizes(self) -> None:
        """Drop the counts of sizes nothing holds (bounded memory over a long run's deltas)."""
        for n in [n for n, used in self._in_use.items() if not used and not self._free.get(n)]:
            for d in (self._in_use, self._peak, self._takes, self._free):
                d.pop(n, None)


_POOL_SIZES_COUNTED = 1024  # distinct sizes whose counts are kept before idle ones are dropped
_POOL = _BufferPool()


def release_free_buffers() -> int:
    """Give the free weight buffers back (e.g. a process done with one model size, or a
    benchmark between cases); returns their bytes. Buffers in use are untouched."""
    return _POOL.release()


def byte_buffer(nbytes: int) -> memoryview:
    """A writable buffer of ``nbytes`` uninitialised bytes (format ``"B"``): the caller must
    write every byte it exposes.

    ``bytearray(n)`` zero-fills: one more pass over the memory than the copy that fills it.
    numpy's allocator skips that (and asks for transparent huge pages on large buffers);
    buffers of 1 MiB and more are recycled from earlier versions (:class:`_BufferPool`).
    """
    if nbytes < POOL_MIN_BYTES:
        return memoryview(np.empty(nbytes, dtype=np.uint8))
    return _POOL.take(nbytes)


def encode(tensors: Mapping[str, Any]) -> memoryview:
    """Serialize ``{name: array or tensor}`` into one safetensors blob: each tensor's buffer is
    copied once, straight into place (no intermediate copy, no zero fill), by two threads when
    the blob is 8 MiB or more."""
    arrays = {k: as_array(v) for k, v in tensors.items()}
    head, offsets = layout({k: (dt, tuple(a.shape)) for k, (a, dt) in arrays.items()})
    total = len(head) + sum(a.nbytes for a, _ in arrays.values())
    blob = byte_buffer(total)
    blob[: len(head)] = head
    out = np.frombuffer(blob, dtype=np.uint8)
    srcs = [(offsets[k], a.reshape(-1).view(np.uint8)) for k, (a, _dt) in arrays.items()]
    if total < _PARALLEL_COPY_FROM:
        _put(out, srcs)
    else:
        # numpy releases the GIL while copying, so two threads copy in parallel. One hand-off
        # of half the bytes, not one per tensor: per-piece futures cost more than they save.
        first, second = _halves(srcs, (total - len(head)) // 2)
        rest = _COPY_POOL.submit(_put, out, second)
        _put(out, first)
        rest.result()
    return blob


_PARALLEL_COPY_FROM = 8 << 20
_COPY_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tensor-copy")
_Pieces = list[tuple[int, np.ndarray]]  # (offset in the blob, uint8 source bytes)


def _put(out: np.ndarray, pieces: _Pieces) -> None:
    for off, src in pieces:
        out[off : off + src.size] = src


def _halves(pieces: _Pieces, half: int) -> tuple[_Pieces, _Pieces]:
    """``pieces`` cut into the first ``half`` bytes and the rest (a tensor may be split)."""
    first: _Pieces = []
    second: _Pieces = []
    left = half
    for off, src in pieces:
        take = min(src.size, left)
        if take:
            first.append((off, src[:take]))
        if take < src.size:
            second.append((off + take, src[take:]))
        left -= take
    return first, second


def decode(blob: bytes | bytearray | memoryview) -> dict[str, tuple[str, np.ndarray]]:
    """Zero-copy views of the tensors in a safetensors blob: ``{name: (dtype name, array)}``.

    BF16 tensors come back as uint16 arrays holding the raw bits (dtype name ``"BF16"``).

    Raises:
        TensorFormatError: the header is malformed, names an unknown dtype, or offsets do not
            fit the blob or the shape.
    """
    mv = memoryview(blob)
    if len(mv) < 8:
        raise TensorFormatError(f"blob of {len(mv)} bytes is shorter than the 8-byte header length")
    (hlen,) = struct.unpack_from("<Q", mv, 0)
    if hlen > len(mv) - 8:
        raise TensorFormatError(f"header length {hlen} exceeds the blob ({len(mv)} bytes)")
    try:
        header = json.loads(bytes(mv[8 : 8 + hlen]))
    except ValueError as exc:
        raise TensorFormatError(f"header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise TensorFormatError("header is not a JSON object")
    base = 8 + hlen
    out: dict[str, tuple[str, np.ndarray]] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = DTYPES[info["dtype"]]
            shape = tuple(int(s) for s in info["shape"])
            begin, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise TensorFormatError(f"tensor {name!r}: bad header entry {info!r}") from None
        n = int(np.prod(shape, dtype=np.int64))
        if any(s < 0 for s in shape) or end - begin != n * dtype.itemsize or begin < 0:
            raise TensorFormatError(f"tensor {name!r}: offsets {begin}..{end} do not fit {shape}")
        if base + end > len(mv):
            raise TensorFormatError(f"tensor {name!r}: data runs past the end of the blob")
        arr = np.frombuffer(mv, dtype=dtype, count=n, offset=base + begin).reshape(shape)
        out[name] = (info["dtype"], arr)
    return out


def to_output(dtype: str, arr: np.ndarray, as_torch: bool) -> Any:
    """``arr`` as handed to callers: numpy, or a torch tensor sharing its memory."""
    if not as_torch:
        return arr
    import torch

    t = torch.from_numpy(arr) if arr.flags.writeable else torch.from_numpy(arr.copy())
    return t.view(torch.bfloat16) if dtype == "BF16" else t
