"""``robofleet bench lerobot`` at tiny sizes runs end to end: real gateways (cloud-acked,
durable) and LeRobot's own ``LearnerService`` driven by LeRobot's actor code; then the learning
comparison, a minute a side: LeRobot's own learner and a robofleet cloud, each training an
unmodified ``python -m lerobot.rl.actor`` in gym-hil; a table, then one JSON line with positive
figures and ratios."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from robofleet.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_bench_lerobot_tiny_prints_table_then_ratios(capsys, monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MUJOCO_GL", "egl")
    argv = ["--episodes", "2", "--episode-steps", "5", "--rounds", "1", "--actors", "2"]
    # 5-step episodes: the actor's first ends within seconds even on a loaded machine.
    learning = ["--learning-minutes", "1.5", "--episode-s", "0.5", "--learning-starts", "5"]
    learning += ["--demo-episodes", "2", "--bucket-s", "45", "--work", str(tmp_path)]
    assert main(["bench", "lerobot", *argv, "--hidden", "16", *learning]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    table = "\n".join(lines[:-1])
    assert "robofleet gateway" in table and "LeRobot learner" in table
    assert "parameter push to 2 actor(s)" in table
    assert "Learning: one LeRobot actor" in table
    res = json.loads(lines[-1])
    assert res["transitions"] == 10 and res["parameter_bytes"] > 0
    for key in (
        "ours_transitions_per_s",
        "lerobot_transitions_per_s",
        "transitions_ratio",
        "ours_push_1_s",
        "lerobot_push_1_s",
        "push_1_ratio",
        "ours_push_2_s",
        "lerobot_push_2_s",
        "push_2_ratio",
    ):
        assert res[key] > 0, key
    # Both learners trained on the actor's episodes and the actor loaded their parameters.
    for side in ("ours", "lerobot"):
        got = res["learning"][side]
        assert got["episodes"] >= 1, (side, got)
        assert got["transitions"] >= 5, (side, got)
        assert got["updates"] >= 1, (side, got)
        assert got["versions_loaded"] >= 1, (side, got)
        assert [c["t_s"] for c in got["curve"]] == [45, 90], (side, got)
    # The demonstrations are a LeRobotDataset both learners read (the scripted pick succeeds).
    info = json.loads((tmp_path / "demos" / "meta" / "info.json").read_text())
    assert info["total_episodes"] == 2 and info["features"]["observation.state"]["shape"] == [18]
    rows = pq.read_table(sorted((tmp_path / "demos" / "data").rglob("*.parquet"))).to_pydict()
    assert np.asarray(rows["next.reward"], dtype=float).sum() == 2.0  # each ends lifted


def test_bench_lerobot_refuses_bad_sizes_by_name(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["bench", "lerobot", "--actors", "0"]) == 2
    assert "--actors" in capsys.readouterr().err
    assert main(["bench", "lerobot", "--episode-s", "0", "--learning-starts", "0"]) == 2
    err = capsys.readouterr().err
    assert "--episode-s" in err and "--learning-starts" in err
