"""A run's live figures: what the dashboard and ``robofleet demo`` show, every two seconds.

Each record appends a row to ``progress.jsonl`` (the intervention-rate curve of the report;
``discarded_episodes``: episodes an operator discarded or rerecorded, never trained on;
thinned past a cap, ``runs.progress_file``),
rewrites ``progress.json`` durably (what a resumed run carries on: run time, robot-seconds,
learner restarts) and inserts metric points for the live charts. A full disk skips the file
writes of that record (logged when the disk fills), never the run: the metric points still go
to the metadata store and the next record writes the files again.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import select

from foundation.durable import append_line, atomic_write_json
from foundation.rows import RowFilter
from foundation.store.metadata_store import MetadataStore
from foundation.store.metrics import insert_metrics
from foundation.store.models import Robot
from runs.clock import RunClock
from runs.progress_file import PROGRESS_FILE, ProgressFile, disk_full

log = logging.getLogger(__name__)


def append_record(path: Path, row: Mapping[str, Any]) -> bool:
    """Append ``row`` as one JSON line to ``path`` (whole or not at all); False (the file as
    it was) when the disk is full.

    Raises:
        OSError: any other failure to write.
    """
    try:
        append_line(path, json.dumps(row))
    except OSError as exc:
        if not disk_full(exc):
            raise
        return False
    return True


def classifier_figures(learner: Mapping[str, float]) -> dict[str, float]:
    """The reward classifier's latest figures among the learner's statistics (``version``,
    ``train_episodes``, ``holdout_episodes``, ``precision``, ``recall``:
    ``cloud_learner.classifier_training``); empty before its first version."""
    return {
        k.removeprefix("classifier_"): float(v)
        for k, v in learner.items()
        if k.startswith("classifier_")
    }


def count_rows(buffer: Any, rows: RowFilter) -> int:
    """Eligible rows of ``buffer`` that ``rows`` keeps: its ``count`` (a sharded run's
    buffer counts in its shards), else the length of its ``select``."""
    count = getattr(buffer, "count", None)
    return int(count(rows)) if callable(count) else len(buffer.select(rows))


class RunProgress:
    """Counts of the run's buffer, rates between records, and where they are written.

    Args:
        store / run_id / run_dir: the run.
        offline_rows: rows of the buffer that are not robots' steps (demonstrations): the
            counts leave them out.
    """

    def __init__(
        self, store: MetadataStore, run_id: str, run_dir: Path, offline_rows: int = 0
    ) -> None:
        self.store, self.run_id, self.run_dir = store, run_id, run_dir
        self.offline_rows = offline_rows
        self._prev: tuple[float, int, int] | None = None
        self.disk_full = False  # the last record's files could not be written
        self._rows = ProgressFile(run_dir / PROGRESS_FILE)

    def _write_files(self, row: dict[str, Any], state: dict[str, Any]) -> None:
        """``progress.jsonl`` and ``progress.json``; skipped while the disk is full."""
        try:
            self._rows.append(row)
            atomic_write_json(self.run_dir / "progress.json", state)
            written = True
        except OSError as exc:
            if not disk_full(exc):
                raise
            written = False
        if not written and not self.disk_full:
            log.warning("run %s: disk full; progress files wait for space", self.run_id)
        self.disk_full = not written

    def counts(self, buffer: Any) -> tuple[int, int]:
        """(env steps, operator interventions) the buffer holds from robots (not demos)."""
        total = len(buffer)
        interventions = count_rows(buffer, RowFilter(interventions_only=True))
        return total - self.offline_rows, interventions - self.offline_rows

    def offline_steps(self, buffer: Any) -> int:
        """Transitions that are not robots' steps: the buffer's demonstrations and the rows
        of the offline data mounted into it."""
        return min(self.offline_rows, len(buffer)) + sum(len(v) for v in buffer.offline)

    def record(
        self,
        buffer: Any,
        clock: RunClock,
        learner: Mapping[str, float],
        *,
        restarts: int,
        hangs: int,
        robots: Sequence[str],
        version: int,
        online_shares: Mapping[str, float] | None = None,
    ) -> dict[str, Any]:
        """Write one record; returns the run's figures now.

        Args:
            buffer: the run's buffer.
            clock: the run's clock.
            learner: the learner's latest statistics (``learner_step``, ``updates_per_s``,
                ``loss``, ...), as the batch server last heard them.
            restarts / hangs: the learner's restarts (all attempts of the run) and hangs.
            robots: names of the robots with a running edge agent.
            version: the newest published policy version.
            online_shares: each task's online share of the learner's batches (runs with
                offline data; ``RunLearning.online_shares``).
        """
        steps, interventions = self.counts(buffer)
        offline = self.offline_steps(buffer)
        rate, steps_per_s = self._rates(steps, interventions)
        elapsed = clock.elapsed()
        stats = buffer.stats()
        row: dict[str, Any] = {
            "wall_s": elapsed,
            "robot_hours": clock.robot_hours,
            "env_steps": steps,
            "offline_steps": offline,
            "interventions": interventions,
            "intervention_rate": rate,
            "policy_version": version,
            "discarded_episodes": int(stats.get("discarded_episodes", 0)),
        }
        shares = dict(online_shares or {})
        if shares:
            row["online_share"] = shares
        classifier = classifier_figures(learner)
        if classifier:
            row["reward_classifier"] = classifier
        state = {
            "elapsed_s": elapsed,
            "robot_seconds": clock.robot_seconds,
            "learner_restarts": restarts,
        }
        self._write_files(row, state)
        self._metrics(buffer, stats, learner, (steps, offline), rate, steps_per_s, robots)
        if shares:
            insert_metrics(
                self.store,
                self.run_id,
                [
                    {"name": "online_share", "task": task, "step": steps, "value": share}
                    for task, share in shares.items()
                ],
            )
        return {
            "elapsed_s": elapsed,
            "env_steps": steps,
            "offline_steps": offline,
            "interventions": interventions,
            "intervention_rate": rate,
            "env_steps_per_s": steps_per_s,
            "learner_updates_per_s": learner.get("updates_per_s", 0.0),
            "learner_step": int(learner.get("learner_step", 0)),
            "loss": learner.get("loss", float("nan")),
            "policy_version": version,
            "learner_restarts": restarts,
            "learner_hangs": hangs,
            "robots": len(robots),
            "robot_hours": clock.robot_hours,
            "discarded_episodes": row["discarded_episodes"],
            "online_share": shares,
            "reward_classifier": classifier,
        }

    def _rates(self, steps: int, interventions: int) -> tuple[float, float]:
        """(intervention rate, env steps per second) since the previous record."""
        now = time.monotonic()
        rate = steps_per_s = 0.0
        if self._prev is not None:
            t, s, i = self._prev
            if steps > s:
                rate = (interventions - i) / (steps - s)
            steps_per_s = (steps - s) / max(now - t, 1e-6)
        self._prev = (now, steps, interventions)
        return rate, steps_per_s

    def _metrics(
        self,
        buffer: Any,
        stats: Mapping[str, Any],
        learner: Mapping[str, float],
        buffer_steps: tuple[int, int],
        rate: float,
        steps_per_s: float,
        robots: Sequence[str],
    ) -> None:
        """Metric points at env step ``buffer_steps[0]``: ``buffer_steps`` is (robot steps,
        offline steps) of the buffer."""
        steps, offline = buffer_steps
        step = int(learner.get("learner_step", 0))
        points: list[dict[str, Any]] = [
            {"name": "intervention_rate", "step": steps, "value": rate},
            {"name": "env_steps_per_s", "step": steps, "value": steps_per_s},
            {
                "name": "learner_updates_per_s",
                "step": step,
                "value": learner.get("updates_per_s", 0.0),
            },
            {"name": "buffer_size", "step": steps, "value": float(len(buffer))},
            {"name": "buffer_robot_steps", "step": steps, "value": float(steps)},
            {"name": "buffer_offline_steps", "step": steps, "value": float(offline)},
            {
                "name": "discarded_episodes",
                "step": steps,
                "value": float(stats.get("discarded_episodes", 0)),
            },
        ]
        hit = stats.get("cache_hit_rate")
        if hit is not None:
            points.append({"name": "cache_hit_rate", "step": steps, "value": float(hit)})
        if np.isfinite(learner.get("loss", float("nan"))):
            points.append({"name": "loss", "step": step, "value": learner["loss"]})
        figures = classifier_figures(learner)
        for name in ("precision", "recall"):  # the run page's reward classifier chart
            if name in figures:
                points.append({"name": f"classifier_{name}", "step": step, "value": figures[name]})
        with self.store.session() as sess:
            for robot in sess.scalars(select(Robot).where(Robot.name.in_(list(robots)))):
                if robot.applied_policy_version is not None:
                    points.append(
                        {
                            "name": "policy_version",
                            "step": steps,
                            "value": float(robot.applied_policy_version),
                            "robot_id": robot.id,
                        }
                    )
        insert_metrics(self.store, self.run_id, points)
