"""Training the run's help probe in the learner (``help.risk: probe``) and shipping it beside
the policy, as :mod:`cloud_learner.classifier_training` does the reward classifier.

Every ``help.probe_every_updates`` learner updates :class:`ProbeTrainer` asks the run's buffer
for the latest ``help.probe_episodes`` ended episodes a policy acted in (observations and
intervention flags, ``buffer.service.batches.RemoteBuffer.policy_episodes``), labels their
autonomous steps (a takeover or a person's failure verdict within ``help.probe_horizon``
steps: :func:`cloud_learner.help_probe.probe_labels`), reads the current policy's head
activations on them and fits the next probe version, once the labels hold a positive and a
negative and only when the episodes changed. The latest version is saved in the run directory
(a restarted learner ships it again) and :class:`ProbePublisher` adds it to every version
published from then on.

Figures (the learner's stats, ``metrics.jsonl`` prefix ``help_probe``): ``help_probe_version``,
``help_probe_steps``, ``help_probe_positives``, ``help_probe_accuracy``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from safetensors.torch import load_file, save

from cloud_learner.help_probe import (
    HelpProbe,
    HelpProbeError,
    fit_probe,
    head_activations,
    probe_labels,
)
from foundation.durable import atomic_write_bytes
from foundation.runspec import HelpSpec

log = logging.getLogger("robofleet.learner")

SAVED = "help_probe.safetensors"  # in the run directory: the latest version


class EpisodeSource(Protocol):
    """Where the episodes come from (``buffer.service.batches.RemoteBuffer``)."""

    def policy_episodes(
        self, limit: int = 100
    ) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]: ...


class ProbeTrainer:
    """Retrains the probe when due; holds the latest version (module docstring).

    Args:
        spec: the run's ``help:``.
        run_dir: where the latest version is kept (:data:`SAVED`).
    """

    def __init__(self, spec: HelpSpec, run_dir: Path) -> None:
        self.spec = spec
        self.path = Path(run_dir) / SAVED
        self.probe: HelpProbe | None = None
        self._trained_on: frozenset[tuple[str, str, int, int]] | None = None
        if self.path.is_file():
            self.probe = HelpProbe.from_tensors(load_file(str(self.path)))
            log.info("help probe version %d loaded", self.probe.version)

    @property
    def version(self) -> int:
        return self.probe.version if self.probe is not None else 0

    def due(self, step: int) -> bool:
        return step > 0 and step % self.spec.probe_every_updates == 0

    def tensors(self) -> dict[str, torch.Tensor]:
        """The latest version's tensors (empty before the first)."""
        return self.probe.to_tensors() if self.probe is not None else {}

    def train(self, source: EpisodeSource, policy: Any) -> dict[str, float] | None:
        """Fit the next version on ``policy``'s activations; its figures, or None when the
        episodes are unchanged or their labels lack a positive or a negative."""
        header, arrays = source.policy_episodes(self.spec.probe_episodes)
        seen = frozenset(
            (str(e["run_id"]), str(e["robot_id"]), int(e["episode_index"]), int(e["steps"]))
            for e in header
        )
        if not header or seen == self._trained_on:
            return None
        labels, keep, start = [], [], 0
        for e in header:
            n = int(e["steps"])
            acted = np.asarray(arrays["is_intervention"][start : start + n], bool)
            y, k = probe_labels(acted, bool(e["failed"]), self.spec.probe_horizon)
            labels.append(y)
            keep.append(k)
            start += n
        y_all, k_all = np.concatenate(labels), np.concatenate(keep)
        if not 0 < y_all[k_all].sum() < k_all.sum():
            return None
        tasks = np.concatenate(
            [np.full(int(e["steps"]), int(e["task_index"]), np.int64) for e in header]
        )
        device = next(policy.parameters()).device
        batch = {
            k: torch.as_tensor(np.asarray(v)[k_all]).to(device)
            for k, v in arrays.items()
            if k.startswith("observation.")
        }
        batch["observation.state"] = batch["observation.state"].float()
        batch["task_index"] = torch.as_tensor(tasks[k_all]).to(device)
        was_training = policy.training
        version = self.version + 1
        policy.eval()
        try:
            features = head_activations(policy, batch)
            probe = fit_probe(features, y_all[k_all], version=version, seed=version)
        except HelpProbeError as exc:
            log.error("help probe not trained: %s", exc)
            return None
        finally:
            policy.train(was_training)
        atomic_write_bytes(self.path, save(probe.to_tensors()))
        self.probe, self._trained_on = probe, seen
        log.info("help probe version %d: %s", version, probe.info)
        return self.figures()

    def figures(self) -> dict[str, float]:
        """The latest version's figures (empty before the first)."""
        if self.probe is None:
            return {}
        out = {"help_probe_version": float(self.probe.version)}
        out.update({f"help_probe_{k}": float(v) for k, v in self.probe.info.items()})
        return out


class ProbePublisher:
    """A ``foundation.contracts.WeightPublisher`` that adds the trainer's latest probe to every
    version (forwards everything else to the wrapped publisher)."""

    def __init__(self, inner: Any, trainer: ProbeTrainer) -> None:
        self.inner = inner
        self.trainer = trainer

    def latest_version(self) -> int:
        return int(getattr(self.inner, "latest_version", lambda: 0)())

    def publish(self, version: int, weights: Mapping[str, torch.Tensor]) -> None:
        self.inner.publish(version, {**weights, **self.trainer.tensors()})

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
