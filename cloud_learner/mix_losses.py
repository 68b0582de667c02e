"""Each task's recent training loss on online rows and on offline rows: what SOP's adaptive
online/offline mix reads (Pan et al. 2026, "SOP: A Scalable Online Post-Training System for
Vision-Language-Action Models": the sampler's online share per task follows the learner's loss
on each side over a sliding window).

The learner measures, every few updates, the policy's behaviour-cloning loss on the rows of
its last batch (no gradient), split by task and by side (``is_offline``), and keeps the last
``window`` measurements of each (task, side). :meth:`TaskLossWindow.stats` gives their means as
``loss_online/<task>`` and ``loss_offline/<task>``; the buffer's batch service turns them into
shares (``buffer.service.batches.MixConfig.share``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import torch

from cloud_learner.core import Batch


class TaskLossWindow:
    """Sliding windows of per-task, per-side loss means.

    Args:
        tasks: the run's task names (``task_index`` order).
        window: measurements kept per (task, side).
    """

    def __init__(self, tasks: Sequence[str], window: int) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.tasks = list(tasks)
        self._w: dict[tuple[int, bool], deque[float]] = {}
        self.window = window

    def add(self, batch: Batch, per_row: torch.Tensor) -> None:
        """Fold one batch's per-row losses (B,) in, by ``task_index`` and ``is_offline``."""
        task = batch["task_index"].long().cpu()
        offline = batch.get("is_offline")
        side = torch.zeros_like(task, dtype=torch.bool) if offline is None else offline.bool().cpu()
        loss = per_row.detach().float().cpu()
        for t in task.unique().tolist():
            for off in (False, True):
                rows = (task == t) & (side == off)
                if bool(rows.any()):
                    q = self._w.setdefault((int(t), off), deque(maxlen=self.window))
                    q.append(float(loss[rows].mean()))

    def stats(self) -> dict[str, float]:
        """``loss_online/<task>`` and ``loss_offline/<task>``: window means of the tasks that
        have both sides measured."""
        out: dict[str, float] = {}
        for t, name in enumerate(self.tasks):
            on, off = self._w.get((t, False)), self._w.get((t, True))
            if on and off:
                out[f"loss_online/{name}"] = sum(on) / len(on)
                out[f"loss_offline/{name}"] = sum(off) / len(off)
        return out


@torch.no_grad()
def per_row_bc_loss(policy: Any, batch: Batch) -> torch.Tensor:
    """The policy's behaviour-cloning loss on each row of ``batch``, shape (B,).

    Policies whose loss is only a batch mean (``per_row_loss = False``: LeRobot's) are
    measured per (task, side) group; each row gets its group's mean.
    """
    was_training = policy.training
    policy.eval()
    try:
        if getattr(policy, "per_row_loss", True):
            out: torch.Tensor = policy.bc_loss(batch)
            return out.reshape(-1)
        task = batch["task_index"].long()
        side = batch.get("is_offline", torch.zeros_like(task, dtype=torch.bool)).bool()
        result = torch.zeros(task.shape[0])
        for t in task.unique().tolist():
            for off in (False, True):
                rows = (task == t) & (side == off)
                if bool(rows.any()):
                    sub = {k: v[rows] for k, v in batch.items()}
                    result[rows.cpu()] = float(policy.bc_loss(sub))
        return result
    finally:
        policy.train(was_training)
