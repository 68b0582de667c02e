"""Batch sources behind :class:`cloud_learner.core.BatchSource`.

* :class:`BufferSource` wraps the replay buffer (``buffer.ReplayBuffer``): it forwards
  ``sample(batch_size, sampler=...)``, the rate limiter and sampler state, and converts the
  numpy batch with :func:`cloud_learner.batch.to_torch_batch`.
* :class:`InMemorySource` holds numpy columns in memory (tests, offline pre-training).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from cloud_learner.batch import BatchError, to_torch_batch
from cloud_learner.core import Batch


class InMemorySource:
    """Uniform sampling from numpy columns of equal length; ``extend`` adds rows.

    ``samples_per_insert`` (optional) mimics the buffer's rate limiter: ``can_sample`` is False
    once ``samples / inserts`` would exceed it.
    """

    def __init__(
        self,
        columns: Mapping[str, np.ndarray] | None = None,
        seed: int = 0,
        samples_per_insert: float | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        self.columns: dict[str, np.ndarray] = {k: np.asarray(v) for k, v in (columns or {}).items()}
        self.rng = np.random.default_rng(seed)
        self.samples_per_insert = samples_per_insert
        self.samples = 0
        self.inserts = self.num_transitions()
        self.device = device

    def num_transitions(self) -> int:
        if not self.columns:
            return 0
        return int(next(iter(self.columns.values())).shape[0])

    def extend(self, rows: Mapping[str, np.ndarray]) -> None:
        """Append rows (same keys as existing columns)."""
        if self.columns and set(rows) != set(self.columns):
            raise KeyError(f"rows have keys {sorted(rows)}, source has {sorted(self.columns)}")
        n = len(next(iter(rows.values())))
        for k, v in rows.items():
            v = np.asarray(v)
            self.columns[k] = np.concatenate([self.columns[k], v]) if k in self.columns else v
        self.inserts += n

    def can_sample(self, batch_size: int) -> bool:
        if self.num_transitions() == 0:
            return False
        if self.samples_per_insert is None:
            return True
        return self.samples + batch_size <= self.samples_per_insert * max(self.inserts, 1)

    def sample_numpy(self, batch_size: int) -> dict[str, np.ndarray]:
        idx = self.rng.integers(0, self.num_transitions(), size=batch_size)
        self.samples += batch_size
        return {k: v[idx] for k, v in self.columns.items()}

    def sample(self, batch_size: int) -> Batch:
        return to_torch_batch(self.sample_numpy(batch_size), self.device)

    def sampler_state(self) -> dict[str, Any]:
        return {"rng": self.rng.bit_generator.state, "samples": self.samples}

    def load_sampler_state(self, state: Mapping[str, Any]) -> None:
        self.rng.bit_generator.state = dict(state["rng"])
        self.samples = int(state["samples"])


class BufferSource:
    """The replay buffer (``buffer.ReplayBuffer``) as a :class:`~cloud_learner.core.BatchSource`.

    ``sample`` forwards to ``buffer.sample(batch_size, sampler=...)`` and converts with
    :func:`cloud_learner.batch.to_torch_batch`. The buffer names tasks (``task``: str); the
    learner needs ``task_index``: position in ``tasks`` (the run's task list). ``can_sample``
    asks the buffer's samples-per-insert rate limiter, when it has one. ``sampler_state`` is the
    sampler's own ``state_dict`` (opaque; stored in checkpoints).

    Raises (from ``sample``):
        BatchError: a sampled task is not in ``tasks``, or the batch is malformed.
    """

    def __init__(
        self,
        buffer: Any,
        tasks: Sequence[str] = (),
        sampler: Any = None,
        device: torch.device | str = "cpu",
    ) -> None:
        self.buffer = buffer
        self.tasks = {name: i for i, name in enumerate(tasks)}
        self.sampler = sampler
        self.device = device

    def num_transitions(self) -> int:
        return len(self.buffer)

    def can_sample(self, batch_size: int) -> bool:
        limiter = getattr(self.buffer, "rate_limiter", None)
        if limiter is not None:
            return bool(limiter.can_sample(batch_size))
        return self.num_transitions() > 0

    def sample(self, batch_size: int) -> Batch:
        arrays = dict(self.buffer.sample(batch_size, sampler=self.sampler, timeout=1.0))
        if "task_index" not in arrays:
            names = arrays.pop("task", None)
            if names is None:
                names = np.array([""] * batch_size)
            unknown = sorted({str(n) for n in names} - set(self.tasks))
            if unknown and not (len(self.tasks) <= 1 and set(map(str, names)) <= {""}):
                raise BatchError(
                    f"sampled tasks {unknown} are not in the run's task list {sorted(self.tasks)}"
                )
            arrays["task_index"] = np.array([self.tasks.get(str(n), 0) for n in names], np.int64)
        return to_torch_batch(arrays, self.device)

    def sampler_state(self) -> dict[str, Any]:
        """The sampler's ``state_dict`` and the rate limiter's counters with the buffer's size
        at that moment (so a resume can count what was inserted while the learner was down)."""
        state: dict[str, Any] = {}
        get = getattr(self.sampler, "state_dict", None)
        if callable(get):
            state["sampler"] = dict(get())
        limiter = getattr(self.buffer, "rate_limiter", None)
        if limiter is not None:
            state["rate_limiter"] = {**limiter.state_dict(), "buffer_rows": len(self.buffer)}
        return state

    def load_sampler_state(self, state: Mapping[str, Any]) -> None:
        """Restore the sampler; resume the rate limiter where the checkpoint left it.

        The limiter's samples come back as checkpointed and its inserts grow by the rows the
        buffer gained since (the edge kept uploading while the learner was down), so the
        samples-per-insert ratio holds across a crash instead of restarting from zero (which
        would stall sampling until ``min_size_to_sample`` new rows arrived).
        """
        load = getattr(self.sampler, "load_state_dict", None)
        if callable(load) and state.get("sampler"):
            load(dict(state["sampler"]))
        limiter = getattr(self.buffer, "rate_limiter", None)
        saved = state.get("rate_limiter")
        if limiter is not None and saved:
            gained = max(len(self.buffer) - int(saved["buffer_rows"]), 0)
            limiter.load_state_dict(
                {"inserts": int(saved["inserts"]) + gained, "samples": int(saved["samples"])}
            )
