"""A run directory on a disk that fills up: the run's figures keep being recorded (metric
points in the metadata store) instead of the run crashing on ``progress.jsonl``, the files
hold no half line, and the next record after space is back writes them again."""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy import func, select

from buffer import ReplayBuffer, StepSchema
from foundation.store.metrics import Metric
from runs.clock import RunClock
from runs.progress import RunProgress, append_record
from tests.cloud_learner.helpers import ACTION, STATE, rows
from tests.fakes.cloud import migrated_store
from tests.fakes.disk import TmpfsDisk


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in path.read_text().splitlines()]  # every line whole


def test_progress_records_go_on_through_a_full_disk(tmp_path: Path) -> None:
    disk = TmpfsDisk(tmp_path / "run", size="1m")
    store = migrated_store(f"sqlite:///{tmp_path}/meta.db", "run-1", algorithm="hg-dagger")
    schema = StepSchema.from_features({"observation.state": STATE}, {"action": ACTION})
    buffer = ReplayBuffer.open(tmp_path / "buffer", schema)
    buffer.append(schema.batch_from_records(rows(60, episode_steps=30)))
    figures = RunProgress(store, "run-1", disk.path)

    def record() -> dict[str, object]:
        return figures.record(buffer, RunClock(), {}, restarts=0, hangs=0, robots=[], version=1)

    def points() -> int:
        with store.session() as s:
            return int(s.scalar(select(func.count()).select_from(Metric)) or 0)

    try:
        record()
        before = points()
        disk.fill()
        got = record()  # no OSError: the figures go on
        assert got["env_steps"] == 60 and figures.disk_full
        assert points() > before  # the metric points still reach the store
        written = len(_lines(disk.path / "progress.jsonl"))  # the last page may have held one
        assert not append_record(disk.path / "evals.jsonl", {"wall_s": 1.0})
        disk.free()
        record()
        assert not figures.disk_full
        assert len(_lines(disk.path / "progress.jsonl")) == written + 1
        assert json.loads((disk.path / "progress.json").read_text())["learner_restarts"] == 0
    finally:
        buffer.close()
        store.close()
        disk.close()
