"""A batch reply's payload: numpy arrays in the safetensors layout, split into ZeroMQ frames
at tensor boundaries, sent and read without copying the tensors.

The layout: an 8-byte little-endian header length, a JSON header of ``dtype``, ``shape`` and
``data_offsets`` per tensor (padded with spaces to 8 bytes), then the tensors. The
concatenation of a reply's payload frames is exactly that layout (``safetensors.numpy.load``
reads it), and no tensor straddles two frames:

* :func:`tensor_frames` (the server): the header and every tensor under 64 KiB copied into
  the first frame, each larger tensor (a camera's frames) its own frame, handed to ZeroMQ
  without a copy (``copy=False``).
* :func:`arrays_in_place` (the learner): arrays over the received frames' own memory,
  writable like ``load``'s; the arrays keep their frames alive (a small tensor that ZeroMQ
  placed off its alignment is copied).

Serialising a ~50 MB camera batch into one ``bytes`` (``safetensors.numpy.save``), receiving
it into another and loading it (a copy of every tensor) made three passes over it that the
learner waited for.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

# safetensors dtype names -> little-endian numpy dtypes (BF16 has no numpy dtype).
DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "U8": np.dtype("u1"),
    "I8": np.dtype("i1"),
    "U16": np.dtype("<u2"),
    "I16": np.dtype("<i2"),
    "F16": np.dtype("<f2"),
    "U32": np.dtype("<u4"),
    "I32": np.dtype("<i4"),
    "F32": np.dtype("<f4"),
    "U64": np.dtype("<u8"),
    "I64": np.dtype("<i8"),
    "F64": np.dtype("<f8"),
}

NAMES = {dt.str: name for name, dt in DTYPES.items()}
INLINE_BYTES = 64 * 1024  # tensors below this travel copied into the header's frame
Frame = bytes | np.ndarray


class PayloadError(ValueError):
    """The payload is not a safetensors layout this reader takes (the reason in the message)."""


def tensor_frames(arrays: Mapping[str, np.ndarray]) -> list[Frame]:
    """``arrays`` as payload frames (module docstring): first the header and the tensors
    under ``INLINE_BYTES`` (largest item size first, so every tensor stays aligned to its
    item size), then each larger tensor as a contiguous little-endian array of its own,
    not copied when it already is one. The arrays must not change until ZeroMQ has sent them.

    Raises:
        PayloadError: a dtype the layout has no name for (objects, strings, complex).
    """
    tensors: list[tuple[str, np.ndarray]] = []
    for name, arr in arrays.items():
        a = np.ascontiguousarray(arr)
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        if a.dtype.str not in NAMES:
            raise PayloadError(f"tensor {name!r}: no safetensors dtype for {a.dtype}")
        tensors.append((name, a))
    small = sorted(
        (t for t in tensors if t[1].nbytes < INLINE_BYTES), key=lambda t: -t[1].dtype.itemsize
    )
    large = [t for t in tensors if t[1].nbytes >= INLINE_BYTES]
    header: dict[str, Any] = {}
    offset = 0
    for name, a in small + large:
        header[name] = {
            "dtype": NAMES[a.dtype.str],
            "shape": list(a.shape),
            "data_offsets": [offset, offset + a.nbytes],
        }
        offset += a.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    first = b"".join([len(raw).to_bytes(8, "little"), raw, *(a.tobytes() for _, a in small)])
    return [first, *(a for _, a in large)]


def arrays_in_place(frames: Sequence[memoryview]) -> dict[str, np.ndarray]:
    """The tensors of a payload (``frames``: its frames' writable buffers, e.g. received
    ``zmq.Frame.buffer`` s; one buffer holding the whole layout is a payload too), each an
    array of its header's shape and dtype over the frame that holds it (no copy; writable
    when the buffer is), or a copy where that memory is off the dtype's alignment or the
    tensor has no elements.

    Raises:
        PayloadError: no frames, a header that is not the layout or not in the first frame,
            a tensor outside the data, of another size than its shape and dtype, or across
            two frames, a dtype numpy lacks (BF16).
    """
    if not frames:
        raise PayloadError("a payload without frames")
    buf = frames[0]
    if buf.nbytes < 8:
        raise PayloadError(f"a payload of {buf.nbytes} bytes has no header length")
    n = int.from_bytes(buf[:8], "little")
    base = 8 + n
    if base > buf.nbytes:
        raise PayloadError(f"header of {n} bytes past the first frame's {buf.nbytes}")
    try:
        header = json.loads(bytes(buf[8:base]))
    except ValueError as exc:
        raise PayloadError(f"header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise PayloadError("header is not a JSON object")
    starts = [0]
    for f in frames:
        starts.append(starts[-1] + f.nbytes)
    out: dict[str, np.ndarray] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = DTYPES[meta["dtype"]]
            shape = tuple(int(d) for d in meta["shape"])
            begin, end = (int(x) for x in meta["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise PayloadError(f"tensor {name!r}: header entry {meta!r}") from None
        count = math.prod(shape)
        lo, hi = base + begin, base + end
        if end - begin != count * dtype.itemsize or begin < 0 or hi > starts[-1]:
            raise PayloadError(
                f"tensor {name!r}: bytes {begin}..{end} for shape {shape} of {meta['dtype']}"
            )
        if count == 0:
            out[name] = np.empty(shape, dtype)
            continue
        i = bisect.bisect_right(starts, lo) - 1
        if hi > starts[i + 1]:
            raise PayloadError(f"tensor {name!r}: bytes {begin}..{end} across two frames")
        arr = np.frombuffer(frames[i], dtype=dtype, count=count, offset=lo - starts[i])
        # ZeroMQ may hand a small frame at any address: an array off its item size's
        # alignment (which torch and some numpy paths refuse or slow down on) is copied.
        out[name] = (arr if arr.flags.aligned else arr.copy()).reshape(shape)
    return out
