"""A run's figures keep the robots' rows and the demonstrations (offline rows) of its buffer
apart: ``progress.jsonl``, the run's metrics (the dashboard's buffer chart, Prometheus) and
``report.json``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from sqlalchemy import select

from buffer import ReplayBuffer, StepSchema
from foundation.runspec import parse_run_spec
from foundation.store.metrics import METRIC_NAMES, Metric
from runs.clock import RunClock
from runs.progress import RunProgress
from runs.report import write_report
from tests.cloud_learner.helpers import ACTION, STATE, rows
from tests.fakes.cloud import migrated_store


def test_progress_metrics_and_report_count_robot_and_offline_rows_apart(tmp_path: Path) -> None:
    store = migrated_store(f"sqlite:///{tmp_path}/meta.db", "run-1", algorithm="hg-dagger")
    schema = StepSchema.from_features({"observation.state": STATE}, {"action": ACTION})
    buffer = ReplayBuffer.open(tmp_path / "buffer", schema)
    demos = [{**r, "is_intervention": True} for r in rows(100, robot_id="demo")]
    buffer.append(schema.batch_from_records(demos))  # an expert's steps, as a run records them
    buffer.append(schema.batch_from_records(rows(60, episode_steps=30)))  # every other one
    figures = RunProgress(store, "run-1", tmp_path, offline_rows=100)
    try:
        got = figures.record(buffer, RunClock(), {}, restarts=0, hangs=0, robots=[], version=1)
    finally:
        buffer.close()
    assert (got["env_steps"], got["offline_steps"], got["interventions"]) == (60, 100, 30)
    row = json.loads((tmp_path / "progress.jsonl").read_text().splitlines()[-1])
    assert (row["env_steps"], row["offline_steps"]) == (60, 100)

    with store.session() as s:
        points = {m.name: m.value for m in s.scalars(select(Metric))}
    store.close()
    assert points["buffer_robot_steps"] == 60.0 and points["buffer_offline_steps"] == 100.0
    assert points["buffer_size"] == 160.0  # everything the buffer holds
    assert {"buffer_robot_steps", "buffer_offline_steps"} <= set(METRIC_NAMES)

    spec = parse_run_spec(
        {"algorithm": "hg-dagger", "tasks": ["reach-v3"], "robots": {"robot_type": "x"}}
    )
    summary = write_report(tmp_path, "run-1", spec, learner_restarts=0, accounts={}, elapsed_s=60.0)
    assert (summary["env_steps"], summary["offline_steps"]) == (60, 100)
    report = json.loads((tmp_path / "report.json").read_text())
    assert (report["env_steps"], report["offline_steps"]) == (60, 100)
    assert np.isfinite(report["minutes"])
