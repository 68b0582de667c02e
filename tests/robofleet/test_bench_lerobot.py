"""``robofleet bench lerobot`` at tiny sizes runs end to end: real gateways (cloud-acked,
durable) and LeRobot's own ``LearnerService`` driven by LeRobot's actor code; a table, then one
JSON line with positive figures and ratios."""

from __future__ import annotations

import json

import pytest

from robofleet.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_bench_lerobot_tiny_prints_table_then_ratios(capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    argv = ["--episodes", "2", "--episode-steps", "5", "--rounds", "1", "--actors", "2"]
    assert main(["bench", "lerobot", *argv, "--hidden", "16"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    table = "\n".join(lines[:-1])
    assert "robofleet gateway" in table and "LeRobot learner" in table
    assert "parameter push to 2 actor(s)" in table
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


def test_bench_lerobot_refuses_bad_sizes_by_name(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["bench", "lerobot", "--actors", "0"]) == 2
    assert "--actors" in capsys.readouterr().err
