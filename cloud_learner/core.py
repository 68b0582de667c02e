"""Every seam of the cloud learner in one file; read this first.

``Policy`` (what a robot runs), ``Algorithm`` (owns a policy and its optimizer: ``update``),
``BatchSource`` (batches from the buffer). Batches are ``dict[str, torch.Tensor]`` with LeRobot
keys (``observation.state`` (B, D) float32, ``action`` (B, A) float32, ...); weights are a flat
``dict[str, torch.Tensor]``, never pickled. The loop, in full, and every batch key with its
shape and dtype are in ``docs/learner.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

Batch = dict[str, torch.Tensor]
Weights = dict[str, torch.Tensor]
Metrics = dict[str, float]


@runtime_checkable
class Policy(Protocol):
    """What acts on a robot. A ``torch.nn.Module`` underneath; the edge agent sees only this.

    ``act`` takes one observation (no batch dimension): ``{"observation.state": (D,) float32,
    "observation.images.<cam>": (H, W, 3) uint8, ...}`` and the task index, and returns
    the action ``(A,) float32`` or, for chunked policies, the chunk ``(T, A) float32``.
    """

    def act(self, observation: Mapping[str, np.ndarray], task: int) -> np.ndarray: ...

    def get_weights(self) -> Weights: ...

    def set_weights(self, weights: Mapping[str, torch.Tensor]) -> None: ...


@runtime_checkable
class Algorithm(Protocol):
    """A learning rule around one policy: HG-DAgger, RECAP, SAC/RLPD.

    ``update`` takes one batch (see the table above), performs one optimisation step and
    returns scalar metrics (``{"loss": 0.12, ...}``). ``state_dict`` holds everything needed
    to continue bit-exactly (networks, optimizers, schedulers, internal counters);
    ``load_state_dict`` raises ``ValueError`` naming mismatching keys or shapes.
    """

    @property
    def policy(self) -> Policy: ...

    def update(self, batch: Batch) -> Metrics: ...

    def bc_update(self, batch: Batch) -> Metrics:
        """One behaviour-cloning step on demonstrations: the run's warm start."""
        ...

    def get_weights(self) -> Weights: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


@runtime_checkable
class BatchSource(Protocol):
    """Where batches come from: the replay buffer behind an adapter, or memory in tests.

    Counts are transitions (rows): ``num_transitions`` every row the source holds,
    ``online_transitions`` the rows robots inserted (demonstrations and other offline rows
    excluded; the learner's ``min_transitions`` gate counts these). ``sample`` returns a
    :data:`Batch` of exactly ``batch_size`` rows. ``can_sample`` is False while the
    samples-per-insert rate limiter would block. ``sampler_state`` is an opaque JSON-able dict
    stored in checkpoints and handed back with ``load_sampler_state``.
    """

    def num_transitions(self) -> int: ...

    def online_transitions(self) -> int: ...

    def can_sample(self, batch_size: int) -> bool: ...

    def sample(self, batch_size: int) -> Batch: ...

    def sampler_state(self) -> dict[str, Any]: ...

    def load_sampler_state(self, state: Mapping[str, Any]) -> None: ...
