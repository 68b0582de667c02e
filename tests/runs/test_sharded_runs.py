"""A run with ``buffer.shards: 2`` on a real ``robofleet cloud`` process tree: each robot's
steps and episode marks land in its own shard, the learner samples the shards and the offline
data mounted in each, a SIGKILLed shard process is restarted by Ray and recovers from its WAL,
the whole cloud killed and started again resumes the run on the same shards, and nothing
acknowledged is lost."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from buffer import BufferSettings, ReplayBuffer, StepSchema
from buffer.service.shards import shard_dir, shard_of
from cloud_learner.metrics import read_metrics
from hal.drivers.metaworld import ACTION_NAMES, STATE_NAMES
from tests.fakes.cloud import RobofleetCloud, store_for
from tests.runs.helpers import (
    LIVE,
    SHARDS,
    events,
    ids_apart,
    progress,
    run_dir,
    run_state,
    spec_file,
    start_run,
    stop_and_report,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def _offline_data(directory: Path) -> Path:
    """A buffer of the simulated Sawyers' features: 3 episodes of reach-v3 of robot
    ``offline``."""
    schema = StepSchema.from_features(
        {"observation.state": {"dtype": "float32", "shape": (39,), "names": STATE_NAMES}},
        {"action": {"dtype": "float32", "shape": (4,), "names": ACTION_NAMES}},
    )
    rows: list[dict[str, Any]] = []
    for ep in range(3):
        for t in range(20):
            last = t == 19
            row: dict[str, Any] = {
                "seq": len(rows),
                "robot_id": "offline",
                "run_id": "earlier",
                "task": "reach-v3",
                "episode_index": ep,
                "frame_index": t,
                "timestamp": t / 10,
                "reward": 0.0,
                "terminated": False,
                "truncated": last,
                "is_intervention": False,
                "policy_version": 1,
                "observation.state": np.full(39, t / 20, np.float32),
                "action": np.zeros(4, np.float32),
            }
            if last:
                row["next.observation.state"] = np.ones(39, np.float32)
            rows.append(row)
    with ReplayBuffer.open(directory, schema, BufferSettings()) as buf:
        buf.append(rows)
    return directory


def _shard_contents(buffer_dir: Path, k: int) -> tuple[set[str], list[dict[str, Any]]]:
    """(robot ids with rows, episode marks) of shard ``k`` of a run that is not running."""
    directory = shard_dir(buffer_dir, k)
    with ReplayBuffer.open(directory, read_only=True) as buf:
        robots = {str(r) for r in buf.read_transitions(buf.select(), count=False)["robot_id"]}
    path = directory / "episode_marks.jsonl"
    marks = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    return robots, marks


def test_a_two_shard_run_routes_robots_samples_offline_data_and_loses_nothing_to_kills(
    tmp_path: Path,
) -> None:
    offline = _offline_data(tmp_path / "offline-data")
    ids_apart(tmp_path)
    cloud = RobofleetCloud(tmp_path, sim_robots=2)
    store = store_for(tmp_path)
    spec = spec_file(
        tmp_path / "spec.yaml",
        "sharded",
        2,
        buffer={"shards": SHARDS, "offline_data": [str(offline)]},
    )
    try:
        run_id = start_run(tmp_path, store, spec, cloud, 40)
        [started] = events(store, run_id, "buffer.shards_started")
        assert started["shards"] == SHARDS and len(set(started["pids"])) == SHARDS

        # SIGKILL shard 0's process: Ray starts it again; it recovers from its WAL and the
        # robots' refused uploads go to it again.
        os.kill(int(started["pids"][0]), signal.SIGKILL)
        wait_until(lambda: bool(events(store, run_id, "buffer.shard_restarted")), 90)
        [restarted] = events(store, run_id, "buffer.shard_restarted")
        assert restarted["shard"] == 0 and restarted["was"] == started["pids"][0]
        steps = progress(store, run_id)["env_steps"]
        wait_until(lambda: progress(store, run_id)["env_steps"] > steps + 30, 90, cloud.fail_text)

        # The whole cloud SIGKILLed and started again: the run resumes on the same shards.
        cloud.kill_tree()
        cloud = RobofleetCloud(tmp_path, sim_robots=2)
        wait_until(lambda: bool(events(store, run_id, "run.resuming")), 60, cloud.fail_text)
        wait_until(lambda: run_state(store, run_id) in LIVE, 150, cloud.fail_text)
        steps = progress(store, run_id)["env_steps"]
        wait_until(lambda: progress(store, run_id)["env_steps"] > steps + 30, 90, cloud.fail_text)

        report = stop_and_report(tmp_path, store, run_id, cloud)
    finally:
        cloud.stop()

    directory = run_dir(store, run_id)
    assert report["acked_lost"] == 0
    assert report["env_steps"] > 0
    [mounted] = report["offline_data"]
    assert mounted["rows"] == 60
    # The learner's batches held rows of the offline data mounted in the shards.
    shares = [r["offline_share"] for r in read_metrics(directory) if "offline_share" in r]
    assert shares and max(shares) > 0
    # Each robot's steps and marks are in its own shard, and the two robots are apart.
    homes: dict[str, int] = {}
    for k in range(SHARDS):
        robots, marks = _shard_contents(directory / "buffer", k)
        assert robots and all(shard_of(r, SHARDS) == k for r in robots), (k, robots)
        assert marks and {str(m["robot_id"]) for m in marks} <= robots
        homes.update(dict.fromkeys(robots, k))
    assert sorted(homes.values()) == list(range(SHARDS))
