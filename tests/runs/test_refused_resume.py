"""A resume the learner refuses (its checkpoint no longer fits the spec) ends the run at once,
on a real ``robofleet cloud`` process tree: no restart of the refused learner, no version
published, no robot acting, no evaluation, never ``running``; the reason names each tensor
that no longer fits and the spec key behind it. With the spec put back, the same cloud resumes
the run, and its robots act only on versions of the resumed learner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from foundation.store.metadata_store import MetadataStore
from foundation.store.models import Run, RunState
from tests.fakes.cloud import RobofleetCloud, cli, store_for
from tests.runs.helpers import (
    events,
    launch,
    progress,
    robot_step_versions,
    run_dir,
    run_state,
    spec_file,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(480)]

LIVE = (RunState.RUNNING, RunState.DEGRADED)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _set_hidden_sizes(store: MetadataStore, run_id: str, sizes: list[int]) -> None:
    """Edit the run's recorded spec (what a resume starts from)."""
    with store.session() as s:
        run = s.get(Run, run_id)
        assert run is not None
        run.spec = {**run.spec, "policy": {**run.spec["policy"], "hidden_sizes": sizes}}


def test_a_resume_the_learner_refuses_ends_the_run_at_once_naming_tensor_and_key(
    tmp_path: Path,
) -> None:
    cloud = RobofleetCloud(tmp_path, sim_robots=1)
    store = store_for(tmp_path)
    try:
        run_id = launch(tmp_path, spec_file(tmp_path / "s.yaml", "refused", 1))
        wait_until(lambda: run_state(store, run_id) in LIVE, 150, cloud.fail_text)
        directory = run_dir(store, run_id)
        wait_until(lambda: (directory / "evals.jsonl").exists(), 90, cloud.fail_text)
        assert cli(tmp_path, "run", "stop", run_id).returncode == 0
        wait_until(lambda: run_state(store, run_id) == RunState.STOPPED, 120, cloud.fail_text)

        # The spec now asks for a wider policy than the run's checkpoints hold.
        _set_hidden_sizes(store, run_id, [256, 256])
        before = {
            kind: len(events(store, run_id, kind))
            for kind in (
                "learner.started",
                "learner.restarted",
                "learner.published",
                "robot.assigned",
            )
        }
        weights = json.loads((directory / "weights" / "latest.json").read_text())
        acted = robot_step_versions(directory)
        assert len(acted) > 0 and acted.max() <= weights["version"]
        evals = _lines(directory / "evals.jsonl")
        live_before = len(events(store, run_id, "run.running"))

        out = cli(tmp_path, "resume", run_id)
        assert out.returncode == 0, out.stderr
        wait_until(lambda: run_state(store, run_id) == RunState.CRASHED, 120, cloud.fail_text)

        run = store.get_run(run_id)
        assert run is not None
        reason = run.reason
        assert reason.startswith("learner refused: cannot resume from checkpoint"), reason
        key = "policy.hidden_sizes: checkpoint has [64, 64], this run has [256, 256]"
        tensor = "policy.head.0.weight: this run shape (256, 39), checkpoint (64, 39)"
        assert f"{tensor} ({key})" in reason, reason
        assert [e["reason"] for e in events(store, run_id, "learner.refused")] == [
            reason.removeprefix("learner refused: ")
        ]
        # Once started, never restarted; nothing published, evaluated or running.
        assert len(events(store, run_id, "learner.started")) == before["learner.started"] + 1
        assert len(events(store, run_id, "learner.restarted")) == before["learner.restarted"]
        assert len(events(store, run_id, "learner.published")) == before["learner.published"]
        # This cloud still holds the last attempt's version: no robot got to act on it.
        assert len(events(store, run_id, "robot.assigned")) == before["robot.assigned"]
        assert json.loads((directory / "weights" / "latest.json").read_text()) == weights
        assert _lines(directory / "evals.jsonl") == evals
        assert len(events(store, run_id, "run.running")) == live_before
        assert len(events(store, run_id, "run.degraded")) == 0

        # The checkpoint's width again: this cloud resumes the run; its robots start only once
        # the resumed learner's first version is out, never acting on the last attempt's.
        _set_hidden_sizes(store, run_id, [64, 64])
        assert cli(tmp_path, "resume", run_id).returncode == 0
        wait_until(lambda: run_state(store, run_id) in LIVE, 150, cloud.fail_text)
        stepped = len(acted) + 30
        wait_until(
            lambda: progress(store, run_id).get("env_steps", 0) > stepped, 90, cloud.fail_text
        )
        assert cli(tmp_path, "run", "stop", run_id).returncode == 0
        wait_until(lambda: run_state(store, run_id) == RunState.STOPPED, 120, cloud.fail_text)
        assert len(events(store, run_id, "learner.refused")) == 1
        assert not (directory / "learner.refused").exists()
        now = robot_step_versions(directory)
        old = weights["version"]
        assert (now > old).sum() > 0, "no robot step of the resumed learner's versions"
        assert (now <= old).sum() == len(acted), "a robot acted on the last attempt's version"
    finally:
        cloud.stop()
