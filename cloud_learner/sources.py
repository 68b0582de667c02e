"""Batch sources behind :class:`cloud_learner.core.BatchSource`.

* :class:`BufferSource` wraps the replay buffer (``buffer.ReplayBuffer``): it forwards
  ``sample(batch_size, sampler=...)``, the rate limiter and sampler state, and converts the
  numpy batch with :func:`cloud_learner.batch.to_torch_batch`.
* :class:`TransitionBatchSource` wraps any ``foundation.contracts.TransitionSource`` (e.g.
  ``buffer.service.batches.RemoteBuffer``, the run's buffer in the cloud process): numpy rows become
  torch batches on the learner's device, rewards scaled on the learner's side.
* :class:`InMemorySource` holds numpy columns in memory (tests, offline pre-training).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from buffer.sampling.rate_limiter import RateLimiter
from cloud_learner.batch import BatchError, to_torch_batch
from cloud_learner.core import Batch
from foundation.contracts import TransitionSource


class TransitionBatchSource:
    """A :class:`~cloud_learner.core.BatchSource` over any ``TransitionSource``.

    Args:
        source: where rows come from (``foundation.contracts.TransitionSource``).
        device: where ``sample`` puts the batch's tensors (the learner's device).
        reward_scale: multiplies ``reward`` of every batch (e.g. 0.1 maps Meta-World's
            0..10 dense reward into 0..1 for SAC).

    ``can_sample`` is True once the source holds a transition (a remote buffer paces nothing:
    the learner applies samples-per-insert itself, ``buffer.RateLimiter``). Sampler state is
    the source's own (stored in checkpoints as is).

    Raises (from ``sample``): ``cloud_learner.batch.BatchError`` for a malformed batch, and
    whatever the source raises (``buffer.service.batches.RemoteBuffer``: ``TimeoutError`` when the
    cloud is gone).
    """

    def __init__(
        self,
        source: TransitionSource,
        device: torch.device | str = "cpu",
        reward_scale: float = 1.0,
    ) -> None:
        self.source = source
        self.device = torch.device(device)
        self.reward_scale = reward_scale

    def num_transitions(self) -> int:
        return self.source.num_transitions()

    def online_transitions(self) -> int:
        """Rows robots inserted (offline data excluded): what samples-per-insert counts."""
        return self.source.online_transitions()

    def can_sample(self, batch_size: int) -> bool:
        return self.num_transitions() > 0

    def sample_numpy(self, batch_size: int) -> dict[str, np.ndarray]:
        """``batch_size`` rows as numpy columns, ``reward`` scaled."""
        arrays = dict(self.source.sample(batch_size))
        if self.reward_scale != 1.0 and "reward" in arrays:
            arrays["reward"] = arrays["reward"] * np.float32(self.reward_scale)
        return arrays

    def sample(self, batch_size: int) -> Batch:
        return to_torch_batch(self.sample_numpy(batch_size), self.device)

    def sampler_state(self) -> dict[str, Any]:
        return self.source.sampler_state()

    def load_sampler_state(self, state: Mapping[str, Any]) -> None:
        self.source.load_sampler_state(state)


class InMemorySource:
    """Uniform sampling from numpy columns of equal length; ``extend`` adds rows.

    ``samples_per_insert`` (optional) applies the sampling side of the buffer's rate limiter
    (``buffer.RateLimiter.sampling_side``): ``can_sample`` is False once ``samples / inserts``
    would exceed it.
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
        self._limiter = (
            RateLimiter.sampling_side(samples_per_insert)
            if samples_per_insert is not None
            else None
        )
        self.samples = 0
        self.inserts = self.num_transitions()
        self.device = device

    def num_transitions(self) -> int:
        if not self.columns:
            return 0
        return int(next(iter(self.columns.values())).shape[0])

    def online_transitions(self) -> int:
        """Every row (this source holds no offline data apart)."""
        return self.num_transitions()

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
        if self._limiter is None:
            return True
        return self._limiter.allows_sample(
            batch_size, inserts=max(self.inserts, 1), samples=self.samples
        )

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

    def online_transitions(self) -> int:
        """The buffer's online window (``len(buffer)``; mounted offline views are outside it)."""
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
