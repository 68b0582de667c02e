"""Every seam of the cloud learner in one file; read this first.

The learner loop, in full (``cloud_learner.loop.Learner`` runs exactly this)::

    source = BufferSource(replay_buffer)          # BatchSource: the buffer behind a thin adapter
    algorithm = HGDAgger(policy, config)          # Algorithm: owns the policy and its optimizer
    publisher = WeightDirectory(run_dir / "weights")  # foundation.contracts.WeightPublisher
    checkpoints = CheckpointManager(run_dir)      # resume-or-refuse, atomic, keep last K

    state = checkpoints.restore(algorithm, source) or fresh   # counters, RNG, sampler state
    while not stop:
        if source.online_transitions() < min_transitions:     # robots' rows, not demos; never
            sleep(); continue                                 # waits on one robot
        if not source.can_sample(batch_size):                 # samples-per-insert limiter
            sleep(); continue
        metrics = algorithm.update(source.sample(batch_size)) # one gradient step
        step += 1; log(step, metrics)
        if step % publish_every == 0 or time_since_publish > T:
            version += 1; publisher.publish(version, algorithm.get_weights())
        if step % checkpoint_every == 0:
            checkpoints.save(step, version, algorithm, source)

On a robot, the edge agent holds a :class:`Policy` and calls ``policy.act(observation, task)``
every control step; when a new version arrives it calls ``policy.set_weights(weights)``.

Batches are ``dict[str, torch.Tensor]`` with LeRobot keys (B = batch size, D = state size,
A = action size, T = chunk length, H/W = image height/width):

=============================  =================  =========  ==================================
key                            shape              dtype      meaning
=============================  =================  =========  ==================================
``observation.state``          (B, D)             float32    proprioception / low-dim state
``observation.images.<cam>``   (B, H, W, 3)       uint8      camera frames (optional)
``action``                     (B, A)             float32    the action that was executed
``action_chunk``               (B, T, A)          float32    executed chunk (chunked policies)
``task_index``                 (B,)               int64      which task of the multi-task run
``is_intervention``            (B,)               bool       an operator chose this action
``reward``                     (B,)               float32    reward after the action
``terminated`` / ``truncated`` (B,)               bool       Gymnasium episode-end flags
``next.observation.state``     (B, D)             float32    state after the action
``episode_index``              (B,)               int64      episode id
``frame_index``                (B,)               int64      step within the episode
=============================  =================  =========  ==================================

Weights are always a flat ``dict[str, torch.Tensor]`` (never pickled) so that comms can ship
them as raw tensors with a manifest and checksums. The learner publishes them through a
:class:`foundation.contracts.WeightPublisher` (``comms.weight_file.WeightDirectory`` in a run,
``cloud_learner.publisher.InMemoryWeightPublisher`` in tests).
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
