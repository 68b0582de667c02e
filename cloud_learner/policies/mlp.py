"""Deterministic regression policy: MLP on state (and CNN features when cameras are given).

With ``spec.image_keys`` empty this is the plain state MLP; with cameras, a shared
:class:`~cloud_learner.policies.base.ConvEncoder` feeds the same MLP ("CNN + MLP").
``chunk_size > 1`` regresses a whole action chunk ``(T, A)``.
Loss: mean squared error per row against ``action`` (or ``action_chunk``).
"""

from __future__ import annotations

import torch

from cloud_learner.core import Batch
from cloud_learner.policies.base import PolicySpec, TorchPolicy, mlp


class MLPPolicy(TorchPolicy):
    """Deterministic policy ``features -> action``; see module docstring."""

    def __init__(self, spec: PolicySpec, text_embeddings: torch.Tensor | None = None) -> None:
        super().__init__(spec, text_embeddings)
        out = spec.action_dim * spec.chunk_size
        self.head = mlp([self.feature_dim, *spec.widths, out])

    def predict(self, batch: Batch, indicator: torch.Tensor | None = None) -> torch.Tensor:
        out: torch.Tensor = self.head(self.encode(batch, indicator))
        if self.spec.chunk_size > 1:
            return out.view(-1, self.spec.chunk_size, self.spec.action_dim)
        return out

    def bc_loss(self, batch: Batch, indicator: torch.Tensor | None = None) -> torch.Tensor:
        """(B,) mean over action dims (and chunk steps) of (prediction - target)^2."""
        target = target_actions(batch, self.spec)
        err = (self.predict(batch, indicator) - target) ** 2
        return err.reshape(err.shape[0], -1).mean(dim=1)


def target_actions(batch: Batch, spec: PolicySpec) -> torch.Tensor:
    """The BC target: ``action`` (B, A) or ``action_chunk`` (B, T, A); clear error if absent."""
    key = "action_chunk" if spec.chunk_size > 1 else "action"
    if key not in batch:
        raise KeyError(
            f"a policy with chunk_size={spec.chunk_size} trains on {key!r}; "
            f"batch has {sorted(batch)}"
        )
    target = batch[key].float()
    want = (spec.chunk_size, spec.action_dim) if spec.chunk_size > 1 else (spec.action_dim,)
    if tuple(target.shape[1:]) != want:
        raise ValueError(
            f"{key} must be (B, {', '.join(map(str, want))}), got {tuple(target.shape)}"
        )
    return target
