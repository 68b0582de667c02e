"""The asynchronous learner loop (the loop drawn in :mod:`cloud_learner.core`).

It never waits for a particular robot: it polls its :class:`~cloud_learner.core.BatchSource`,
trains whenever the buffer holds ``min_transitions`` robot transitions (demonstrations and
other offline rows do not count) and the rate limiter allows a sample,
publishes weights every N updates or T seconds, checkpoints atomically every M updates and
logs metrics. ``Learner.start`` resumes from the run directory's latest checkpoint or refuses.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from cloud_learner.checkpoint import (
    CheckpointManager,
    CheckpointState,
    RunDirHasCheckpoints,
    capture_rng,
    check_resumable,
    restore_rng,
)
from cloud_learner.config import LearnerSettings
from cloud_learner.core import Algorithm, BatchSource, Metrics
from cloud_learner.metrics import MetricsWriter
from foundation.contracts import WeightPublisher
from foundation.durable import append_line

log = logging.getLogger("robofleet.learner")

# Called after each checkpoint / publish (e.g. to record it in the metadata store). A learner
# killed between a publish (or checkpoint) and its hook call announces it again at the next
# start, so a hook must ignore what it already recorded.
Hook = Callable[[str, Mapping[str, Any]], None]

# One fsynced line per version, written before the version is published: what a restarted
# learner re-announces to the hook for versions shipped after the last checkpoint.
PUBLISHED = "published.jsonl"


class Learner:
    """Owns the counters (learner step, policy version) around one :class:`Algorithm`.

    ``model_config``: what a checkpoint must agree with to be resumed; ``spec``: the user's
    settings it was made from (a run spec's fields), kept with each checkpoint so that a
    refused resume names the keys the user changed.
    """

    def __init__(
        self,
        run_dir: Path | str,
        algorithm: Algorithm,
        source: BatchSource,
        publisher: WeightPublisher,
        settings: LearnerSettings,
        model_config: Mapping[str, Any],
        hook: Hook | None = None,
        spec: Mapping[str, Any] | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.algorithm = algorithm
        self.source = source
        self.publisher = publisher
        self.settings = settings
        self.model_config = dict(model_config)
        self.spec = dict(spec or {})
        self.hook = hook
        self.checkpoints = CheckpointManager(self.run_dir, settings.keep_checkpoints)
        self.step = 0
        self.version = 0
        self.training_started = False
        # The policy's normalisation is set (fitted on data, or loaded with starting weights):
        # it is never fitted again, across restarts too.
        self.normalized = False
        self.last_batch: dict[str, torch.Tensor] | None = None
        self.metrics: MetricsWriter | None = None
        self._last_publish = time.monotonic()

    # -- start / resume --------------------------------------------------------------------

    def start(self, resume: bool) -> bool:
        """Prepare the run dir; returns True when resumed from a checkpoint.

        Raises:
            RunDirHasCheckpoints: checkpoints exist and ``resume`` is False.
            IncompatibleCheckpoint: the checkpoint's tensors do not fit the model or its
                model config differs (each tensor named with both shapes and the keys
                behind it; each key with both values), checked before anything is loaded.
            ValueError: a part of the state that check does not compare (an optimizer's)
                does not fit.
        """
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.checkpoints.sweep_temp()
        latest = self.checkpoints.latest()
        if latest is not None and not resume:
            raise RunDirHasCheckpoints(
                f"run dir {self.run_dir} already has checkpoints (latest: {latest.name}); "
                "resume it (--resume / `robofleet resume`) or choose a new run dir"
            )
        # Versions robots may already hold (published before a crash) are never reused.
        last_published = int(getattr(self.publisher, "latest_version", lambda: 0)())
        if latest is None:
            self.version = last_published
            self._announce_unrecorded(after_version=0, up_to=last_published)
            self.metrics = MetricsWriter(self.run_dir)
            log.info("starting a fresh run in %s", self.run_dir)
            return False
        state = self.checkpoints.load(latest)
        check_resumable(latest, state, self.algorithm.state_dict(), self.model_config, self.spec)
        self.algorithm.load_state_dict(state.algorithm)
        self.source.load_sampler_state(state.sampler)
        restore_rng(state.rng)
        self.step = state.learner_step
        self.training_started = bool(state.counters.get("training_started", False))
        self.normalized = bool(state.counters.get("normalized", self.step > 0))
        self.version = max(state.policy_version, last_published)
        self._announce_unrecorded(after_version=state.policy_version, up_to=last_published)
        if self.hook is not None:
            self.hook(
                "checkpoint",
                {
                    "learner_step": state.learner_step,
                    "policy_version": state.policy_version,
                    "path": str(latest),
                },
            )
        self.metrics = MetricsWriter(self.run_dir, resume_step=self.step)
        log.info(
            "resumed %s at learner step %d, policy version %d", latest, self.step, self.version
        )
        self.publish()  # robots get a version from the resumed learner right away
        return True

    def _announce_unrecorded(self, after_version: int, up_to: int) -> None:
        """Tell the hook again of the versions in (after_version, up_to] (published after the
        last checkpoint, so possibly never announced before a crash)."""
        journal = self.run_dir / PUBLISHED
        if self.hook is None or up_to <= after_version or not journal.exists():
            return
        for line in journal.read_text().splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:  # a line torn by the crash: its version never shipped
                continue
            if after_version < int(entry["version"]) <= up_to:
                self.hook("published", entry)

    # -- one iteration ---------------------------------------------------------------------

    def ready(self) -> bool:
        """Whether an online update can run now: the source holds ``min_transitions`` robot
        transitions (``online_transitions``; offline rows do not count) and its rate limiter
        allows a batch. The first time, logs and records the buffer's counts (``start``)."""
        counts = self.buffer_counts()
        if counts["robot_steps"] < self.settings.min_transitions:
            return False
        if not self.training_started:
            self.training_started = True
            log.info(
                "online training starts: the buffer holds %d >= %d robot transitions"
                " (and %d of demonstrations and offline data)",
                counts["robot_steps"],
                self.settings.min_transitions,
                counts["offline_steps"],
            )
            assert self.metrics is not None
            self.metrics.write(self.step, counts, prefix="start")
            self.metrics.flush()
        return self.source.can_sample(self.settings.batch_size)

    def buffer_counts(self) -> dict[str, float]:
        """The source's transitions apart: ``robot_steps`` (rows robots inserted) and
        ``offline_steps`` (demonstrations and other offline rows)."""
        total = self.source.num_transitions()
        robot = self.source.online_transitions()
        return {"robot_steps": float(robot), "offline_steps": float(max(total - robot, 0))}

    def train_step(self) -> Metrics:
        """One update, then publish / checkpoint when due."""
        assert self.metrics is not None, "call start() first"
        batch = self.source.sample(self.settings.batch_size)
        self.last_batch = batch  # e.g. for loss measurements beside the update
        metrics = self.algorithm.update(batch)
        if "is_offline" in batch:  # the share of mounted offline rows the batch really had
            metrics = {**metrics, "offline_share": float(batch["is_offline"].float().mean())}
        self.step += 1
        if self.step % self.settings.log_every_updates == 0:
            metrics = {**metrics, **self.buffer_counts(), "policy_version": float(self.version)}
            self.metrics.write(self.step, metrics)
        due = self.step % self.settings.publish_every_updates == 0 or (
            time.monotonic() - self._last_publish >= self.settings.publish_every_seconds
        )
        if due:
            self.publish()
        if self.step % self.settings.checkpoint_every_updates == 0:
            self.save_checkpoint()
        return metrics

    def run(
        self, should_stop: Callable[[], bool] = lambda: False, idle_sleep: float = 0.05
    ) -> None:
        """Train until ``max_updates`` (if set) or ``should_stop()``; never blocks on a robot."""
        while not should_stop():
            if self.settings.max_updates and self.step >= self.settings.max_updates:
                break
            if not self.ready():
                time.sleep(idle_sleep)
                continue
            self.train_step()

    # -- publish / checkpoint --------------------------------------------------------------

    def publish(self) -> None:
        """Publish the algorithm's weights as the next version (and tell the hook)."""
        self.version += 1
        weights = self.algorithm.get_weights()
        entry = {
            "version": self.version,
            "learner_step": self.step,
            "num_bytes": sum(t.numel() * t.element_size() for t in weights.values()),
        }
        append_line(self.run_dir / PUBLISHED, json.dumps(entry))
        self.publisher.publish(self.version, weights)
        self._last_publish = time.monotonic()
        if self.hook is not None:
            self.hook("published", entry)

    def save_checkpoint(self) -> Path:
        assert self.metrics is not None
        self.metrics.flush()  # metrics up to this step are durable with the checkpoint
        path = self.checkpoints.save(
            CheckpointState(
                learner_step=self.step,
                policy_version=self.version,
                algorithm=self.algorithm.state_dict(),
                config=self.model_config,
                spec=self.spec,
                sampler=self.source.sampler_state(),
                counters={"training_started": self.training_started, "normalized": self.normalized},
                rng=capture_rng(),
            )
        )
        if self.hook is not None:
            self.hook(
                "checkpoint",
                {"learner_step": self.step, "policy_version": self.version, "path": str(path)},
            )
        return path

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()


def set_torch_threads(n: int) -> None:
    """Bound torch's CPU threads (2-core machines share them with the buffer and comms)."""
    torch.set_num_threads(n)
