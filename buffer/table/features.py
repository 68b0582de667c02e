"""The step columns: the scalar columns every step has, and one array feature's spec.

The table of columns and their meaning is in docs/buffer.md ("Step schema").
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

SCALAR_COLUMNS: dict[str, pa.DataType] = {
    "seq": pa.int64(),
    "robot_id": pa.string(),
    "run_id": pa.string(),
    "task": pa.string(),
    "episode_index": pa.int64(),
    "frame_index": pa.int64(),
    "timestamp": pa.float64(),
    "reward": pa.float32(),
    "terminated": pa.bool_(),
    "truncated": pa.bool_(),
    "is_intervention": pa.bool_(),
    "policy_version": pa.int64(),
}
OPTIONAL_ACTIONS = ("action.policy", "action.operator")
FINAL_PREFIX = "next."
DTYPES = {"float32", "float64", "float16", "int64", "int32", "int16", "int8", "uint8", "bool"}


@dataclass(frozen=True)
class FeatureSpec:
    """One array feature: ``name`` (e.g. ``observation.state``), numpy ``dtype``, ``shape``.

    ``is_image`` marks uint8 HWC camera frames (LeRobot dtype ``image``/``video``).
    """

    name: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    names: tuple[str, ...] | None = None
    is_image: bool = False

    @functools.cached_property
    def size(self) -> int:
        return math.prod(self.shape)

    @functools.cached_property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def arrow_type(self) -> pa.DataType:
        return pa.list_(pa.from_numpy_dtype(self.dtype), self.size)

    def to_lerobot(self) -> dict[str, Any]:
        """The LeRobot feature dict (``dtype``, ``shape``, ``names``)."""
        dtype = "image" if self.is_image else str(self.dtype)
        names: Any = list(self.names) if self.names else None
        if self.is_image and names is None:
            names = ["height", "width", "channels"]
        return {"dtype": dtype, "shape": tuple(self.shape), "names": names}

    @classmethod
    def from_lerobot(cls, name: str, spec: Mapping[str, Any]) -> FeatureSpec:
        """Parse one LeRobot feature dict.

        Raises:
            ValueError: unknown dtype, a non-positive or missing shape, or an image that is not
                HWC with 1, 3 or 4 channels.
        """
        if "dtype" not in spec or "shape" not in spec:
            raise ValueError(f"feature {name!r}: needs 'dtype' and 'shape', got {dict(spec)!r}")
        dtype_s = str(spec["dtype"])
        shape = tuple(int(d) for d in spec["shape"])
        if not shape or any(d <= 0 for d in shape):
            raise ValueError(f"feature {name!r}: shape must be positive, got {shape}")
        names = spec.get("names")
        names_t = tuple(str(n) for n in names) if isinstance(names, list | tuple) else None
        is_image = dtype_s in ("image", "video") or (
            dtype_s == "uint8" and len(shape) == 3 and name.startswith("observation.images")
        )
        if is_image:
            if len(shape) != 3 or shape[2] not in (1, 3, 4):
                raise ValueError(f"feature {name!r}: images must be HWC, got shape {shape}")
            return cls(name, np.dtype(np.uint8), shape, names_t, True)
        if dtype_s not in DTYPES:
            raise ValueError(f"feature {name!r}: unsupported dtype {dtype_s!r}")
        return cls(name, np.dtype(dtype_s), shape, names_t, False)
