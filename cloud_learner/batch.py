"""The thin adapter from the buffer's numpy batches to the learner's torch batches.

The buffer samples ``dict[str, numpy.ndarray]`` with the LeRobot keys listed in
:mod:`cloud_learner.core`; :func:`to_torch_batch` checks shapes and dtypes, converts without
copying where it can, and moves the batch to the learner's device.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from cloud_learner.core import Batch

REQUIRED_KEYS = ("observation.state", "action", "task_index", "is_intervention")
_FLOAT_KEYS = ("observation.state", "next.observation.state", "action", "action_chunk", "reward")
_BOOL_KEYS = (
    "is_intervention",
    "is_demonstration",
    "is_offline",
    "terminated",
    "truncated",
    "success",
    "action_chunk_is_pad",
)
_INT_KEYS = ("task_index", "episode_index", "frame_index", "policy_version")


class BatchError(ValueError):
    """A sampled batch does not have the keys, shapes or dtypes the learner needs."""


def to_torch_batch(
    arrays: Mapping[str, np.ndarray],
    device: torch.device | str = "cpu",
    required: tuple[str, ...] = REQUIRED_KEYS,
) -> Batch:
    """Convert and validate one batch.

    Floats become float32, flags bool, indices int64, images stay uint8 ``(B, H, W, 3)``.
    Keys the learner does not know (e.g. ``seq``, ``robot_id``) are kept when numeric and
    dropped when not (strings cannot be tensors).

    Raises:
        BatchError: a required key is missing, rows disagree on B, or an image is not
            ``(B, H, W, 3)`` uint8. The message names the key and what was found.
    """
    missing = [k for k in required if k not in arrays]
    if missing:
        raise BatchError(f"batch is missing {missing}; it has {sorted(arrays)}")
    sizes = {k: np.asarray(v).shape[0] if np.asarray(v).ndim else -1 for k, v in arrays.items()}
    b = sizes["observation.state"]
    wrong = {k: s for k, s in sizes.items() if s != b}
    if wrong:
        raise BatchError(f"all keys must have batch size {b} (observation.state); got {wrong}")
    out: Batch = {}
    for key, value in arrays.items():
        arr = np.asarray(value)
        if ".images." in key:
            if arr.dtype != np.uint8 or arr.ndim != 4 or arr.shape[-1] != 3:
                raise BatchError(f"{key} must be (B, H, W, 3) uint8, got {arr.shape} {arr.dtype}")
            tensor = torch.from_numpy(np.ascontiguousarray(arr))
        elif key in _FLOAT_KEYS:
            tensor = torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32))
        elif key in _BOOL_KEYS:
            tensor = torch.from_numpy(np.ascontiguousarray(arr).astype(bool))
        elif key in _INT_KEYS:
            tensor = torch.from_numpy(np.ascontiguousarray(arr, dtype=np.int64))
        elif arr.dtype.kind in "biuf":
            tensor = torch.from_numpy(np.ascontiguousarray(arr))
        else:
            continue
        out[key] = tensor.to(device, non_blocking=True)
    if out["observation.state"].ndim != 2:
        raise BatchError(
            f"observation.state must be (B, D), got {tuple(out['observation.state'].shape)}"
        )
    return out
