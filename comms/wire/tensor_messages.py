"""Arrays as ``pb.Tensor`` messages (dtype name, shape, raw bytes): the Act service's
observations and actions."""

from __future__ import annotations

from typing import Any

import numpy as np

from comms.proto import robofleet_pb2 as pb
from comms.wire import tensors as T


def tensor_to_proto(value: Any) -> pb.Tensor:
    arr, dtype = T.as_array(value)
    return pb.Tensor(dtype=dtype, shape=list(arr.shape), data=arr.tobytes())


def tensor_from_proto(t: pb.Tensor) -> np.ndarray:
    """Raises TensorFormatError when dtype, shape and byte count disagree."""
    if t.dtype not in T.DTYPES:
        raise T.TensorFormatError(f"unknown dtype {t.dtype!r}")
    dt = T.DTYPES[t.dtype]
    n = int(np.prod(list(t.shape), dtype=np.int64)) if t.shape else 1
    if any(s < 0 for s in t.shape) or n * dt.itemsize != len(t.data):
        raise T.TensorFormatError(f"{len(t.data)} bytes do not hold {t.dtype}{list(t.shape)}")
    return np.frombuffer(t.data, dtype=dt).reshape(tuple(t.shape))
