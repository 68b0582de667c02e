"""What every learning rule here shares: publishing its policy's weights, one clipped
optimizer step, its warm start, and its state as named parts (the learner's checkpoints).

An algorithm subclasses :class:`AlgorithmBase`, sets ``policy``, ``config`` (a dataclass)
and ``updates``, and lists its networks and optimizers in :meth:`AlgorithmBase.parts`;
tensors that are neither (RECAP's thresholds, SAC's temperature) go through
:meth:`AlgorithmBase.extra_state` and :meth:`AlgorithmBase.load_extra_state`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict
from typing import Any

import torch

from cloud_learner.core import Batch, Metrics, Weights
from cloud_learner.policies.base import load_weights_strict


def clipped_step(
    optimizer: torch.optim.Optimizer,
    loss: torch.Tensor,
    params: Iterable[torch.nn.Parameter],
    max_norm: float,
) -> torch.Tensor:
    """Back-propagate ``loss`` (a scalar), clip the gradients of ``params`` to a total L2
    norm of ``max_norm`` and step ``optimizer``; returns the norm before clipping (scalar)."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    optimizer.step()
    return norm


class AlgorithmBase:
    """The parts of ``cloud_learner.core.Algorithm`` every rule here implements alike."""

    policy: Any
    config: Any
    updates: int

    def update(self, batch: Batch) -> Metrics:
        raise NotImplementedError

    def parts(self) -> dict[str, torch.nn.Module | torch.optim.Optimizer]:
        """Checkpoint key -> the network or optimizer saved under it (``policy`` first)."""
        raise NotImplementedError

    def extra_state(self) -> dict[str, Any]:
        """State beyond :meth:`parts` (tensors cloned); none by default."""
        return {}

    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`extra_state` saved."""

    def bc_update(self, batch: Batch) -> Metrics:
        """One behaviour-cloning step on demonstrations (the run's warm start): this
        algorithm's own update, since every demonstration step is an operator's label."""
        return self.update(batch)

    def get_weights(self) -> Weights:
        weights: Weights = self.policy.get_weights()
        return weights

    def state_dict(self) -> dict[str, Any]:
        """Each part's ``state_dict``, :meth:`extra_state`, ``updates`` and ``config``
        (the config dataclass as a dict)."""
        out: dict[str, Any] = {name: part.state_dict() for name, part in self.parts().items()}
        out.update(self.extra_state())
        out["updates"] = self.updates
        out["config"] = asdict(self.config)
        return out

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output.

        Raises:
            ValueError: a network's tensors do not fit (each named: ``load_weights_strict``).
            KeyError: a part is missing from ``state``.
        """
        for name, part in self.parts().items():
            if isinstance(part, torch.nn.Module):
                load_weights_strict(part, state[name])
            else:
                part.load_state_dict(state[name])
        self.load_extra_state(state)
        self.updates = int(state["updates"])
