"""Training the run's reward classifier in the learner, during the run (``reward.source:
classifier``), and shipping it beside the policy.

Every ``classifier.every_updates`` learner updates :class:`ClassifierTrainer` asks the run's
buffer for the episodes people labelled (``buffer.table.labels``: outcome marks an operator
gave, not the driver's nor the classifier's). A fixed share of them
(``classifier.holdout_fraction``, chosen by a hash of each episode's key, so an episode is held
out on every retraining and never trained on) measures the classifier; the others train it
(``cloud_learner.reward_classifier``) once there are ``classifier.min_labelled_episodes``
labelled episodes with a success and a failure among those trained on, and again only when a
label was added or changed. Each training is the next classifier version; it is saved in the run directory (a restarted learner ships it again)
and :class:`ClassifierPublisher` adds it to every policy version published from then on.

Figures (``metrics.jsonl`` prefix ``classifier`` and the learner's stats the run page charts):
``classifier_version``, ``classifier_train_episodes``, ``classifier_holdout_episodes``,
``classifier_precision``, ``classifier_recall`` (per episode on the held-out episodes).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from safetensors.torch import load_file, save

from cloud_learner.reward_classifier import (
    LabelledEpisode,
    RewardClassifier,
    RewardClassifierError,
    episode_precision_recall,
    fit_reward_classifier,
    holdout,
)
from foundation.durable import atomic_write_bytes
from foundation.runspec import ClassifierSpec

log = logging.getLogger("robofleet.learner")

SAVED = "reward_classifier.safetensors"  # in the run directory: the latest version
NEXT = "next."


class LabelSource(Protocol):
    """Where the labelled episodes come from (``buffer.service.batches.RemoteBuffer``)."""

    def labelled_episodes(self) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]: ...


def to_episodes(
    header: Sequence[Mapping[str, Any]], arrays: Mapping[str, np.ndarray]
) -> list[tuple[tuple[str, str, int], LabelledEpisode]]:
    """The batch service's ``labelled_episodes`` reply as (key, episode) pairs: each episode's
    ``next.observation.*`` rows become its frames; the verdict ends a labelled episode, so its
    verdict frame is the last step."""
    out = []
    start = 0
    keys = [k for k in arrays if k.startswith(NEXT)]
    for e in header:
        n = int(e["steps"])
        frames = {k.removeprefix(NEXT): np.asarray(arrays[k][start : start + n]) for k in keys}
        start += n
        key = (str(e["run_id"]), str(e["robot_id"]), int(e["episode_index"]))
        episode = LabelledEpisode(frames, str(e["verdict"]), n - 1, int(e.get("task_index", 0)))
        out.append((key, episode))
    return out


class ClassifierTrainer:
    """Retrains the classifier when due; holds the latest version (module docstring).

    Args:
        spec: the run's ``reward.classifier``.
        features: the robots' observation features (LeRobot feature dicts).
        run_dir: where the latest version is kept (:data:`SAVED`).
        epochs: training passes per version.
    """

    def __init__(
        self,
        spec: ClassifierSpec,
        features: Mapping[str, Any],
        run_dir: Path,
        epochs: int = 100,
    ) -> None:
        self.spec = spec
        self.features = dict(features)
        self.path = Path(run_dir) / SAVED
        self.epochs = epochs
        self.classifier: RewardClassifier | None = None
        # The labelled episodes the latest version saw: the same labels train nothing new
        # (a refit would cost learner time and ship a version that differs only by its seed).
        self._trained_on: frozenset[tuple[str, str, int, str, int]] | None = None
        if self.path.is_file():
            self.classifier = RewardClassifier.from_tensors(load_file(str(self.path)))
            log.info("reward classifier version %d loaded", self.classifier.version)

    @property
    def version(self) -> int:
        return self.classifier.version if self.classifier is not None else 0

    def due(self, step: int) -> bool:
        return step > 0 and step % self.spec.every_updates == 0

    def tensors(self) -> dict[str, torch.Tensor]:
        """The latest version's tensors (empty before the first)."""
        return self.classifier.to_tensors() if self.classifier is not None else {}

    def train(self, source: LabelSource) -> dict[str, float] | None:
        """Train the next version from ``source``'s labelled episodes; its figures, or None
        when there are too few labels (fewer than ``min_labelled_episodes``, or no success or
        no failure to train on) or no label changed since this trainer's latest version."""
        header, arrays = source.labelled_episodes()
        labels = frozenset(
            (
                str(e["run_id"]),
                str(e["robot_id"]),
                int(e["episode_index"]),
                str(e["verdict"]),
                int(e["steps"]),
            )  # fmt: skip
            for e in header
        )
        if labels == self._trained_on:
            return None
        pairs = to_episodes(header, arrays)
        if len(pairs) < self.spec.min_labelled_episodes:
            return None
        held = [ep for key, ep in pairs if holdout(key, self.spec.holdout_fraction)]
        train = [ep for key, ep in pairs if not holdout(key, self.spec.holdout_fraction)]
        if not {"success", "failure"} <= {ep.verdict for ep in train}:
            return None
        version = self.version + 1
        try:
            model = fit_reward_classifier(
                train,
                self.features,
                epochs=self.epochs,
                seed=version,
                threshold=self.spec.threshold,
                version=version,
            )
        except RewardClassifierError as exc:
            log.error("reward classifier not trained: %s", exc)
            return None
        precision, recall, n = episode_precision_recall(model, held, self.spec.threshold)
        figures = {
            "classifier_version": float(version),
            "classifier_train_episodes": float(len(train)),
            "classifier_holdout_episodes": float(n),
            "classifier_precision": precision,
            "classifier_recall": recall,
        }
        model.info.update(figures)
        atomic_write_bytes(self.path, save(model.to_tensors()))
        self.classifier = model
        self._trained_on = labels
        log.info(
            "reward classifier version %d: %d episodes trained on, %d held out: "
            "precision %.2f recall %.2f",
            version,
            len(train),
            n,
            precision,
            recall,
        )
        return figures

    def figures(self) -> dict[str, float]:
        """The latest version's figures (empty before the first)."""
        if self.classifier is None:
            return {}
        return {k: float(v) for k, v in self.classifier.info.items() if k.startswith("classifier_")}


class ClassifierPublisher:
    """A ``foundation.contracts.WeightPublisher`` that adds the trainer's latest classifier
    to every version (forwards everything else to the wrapped publisher)."""

    def __init__(self, inner: Any, trainer: ClassifierTrainer) -> None:
        self.inner = inner
        self.trainer = trainer

    def latest_version(self) -> int:
        return int(getattr(self.inner, "latest_version", lambda: 0)())

    def publish(self, version: int, weights: Mapping[str, torch.Tensor]) -> None:
        self.inner.publish(version, {**weights, **self.trainer.tensors()})

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
