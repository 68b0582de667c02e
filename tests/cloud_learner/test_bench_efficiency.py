"""Plumbing of ``robofleet bench efficiency`` on a tiny budget (correctness, not timing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from robofleet.bench.efficiency import _sync_schedule, _system_schedule
from robofleet.sim.hgdagger import LabelledSteps, MultiTaskConfig, run_multitask

TASKS = ["reach-v3", "button-press-topdown-v3"]
# Every evaluation episode must succeed: with a handful of evaluation episodes a lower target
# can be met by the initial policy's very first evaluation, ending the system run before any
# robot stepped (robots take tens of seconds to start on a loaded machine).
PLUMBING_TARGET = 1.0


def test_labelled_steps_refuses_empty_sample() -> None:
    with pytest.raises(ValueError, match="no labelled step"):
        LabelledSteps(0).sample(4)


def test_sync_loop_counts_steps_labels_and_updates() -> None:
    cfg = MultiTaskConfig(
        tasks=TASKS, max_env_steps=400, eval_every_steps=200, eval_episodes=2, bc_updates=20
    )
    r = run_multitask(cfg)
    hist = r["history"]
    assert r["demo_labels"] == len(TASKS) * cfg.max_episode_steps
    # Evaluations at the start and every 200 env steps (stopping early only at the target).
    steps = [h["env_steps"] for h in hist]
    assert steps[0] == 0 and steps == sorted(steps) and steps[-1] == r["env_steps"]
    assert r["env_steps"] <= cfg.max_env_steps
    assert 0 <= r["labels"] <= r["env_steps"]
    # 50 updates (0.5 per step x 100 steps) after each intervened episode, none otherwise.
    extra = r["updates"] - cfg.bc_updates
    assert extra % 50 == 0 and extra // 50 <= r["env_steps"] // cfg.max_episode_steps
    assert (extra > 0) == (r["labels"] > 0)
    assert (
        r["episodes"] == r["env_steps"] // cfg.max_episode_steps and r["finetunes"] == extra // 50
    )
    sched = _sync_schedule(r, cfg.bc_updates)
    if r["env_steps"]:
        assert sched["updates_per_env_step"] == pytest.approx(extra / r["env_steps"], abs=1e-3)
        assert sched["intervention_rate"] == pytest.approx(r["labels"] / r["env_steps"], abs=1e-3)
    assert sched["version_lag_mean"] == 0.0  # it always acts with the newest policy
    hit = r["env_steps_to_target"]
    if hit is None:
        assert r["best_success"] < cfg.target_success
    else:
        first = next(h for h in hist if h["success_mean"] >= cfg.target_success)
        assert hit == first["env_steps"] and r["labels_to_target"] == first["labels"]
    for h in hist:
        assert set(h["success"]) == set(TASKS)
        assert h["success_mean"] == pytest.approx(np.mean(list(h["success"].values())))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bench_runs_all_three_and_ratios_follow_raw_numbers(tmp_path: Path) -> None:
    env = {**os.environ, "ROBOFLEET_DATA_DIR": str(tmp_path / "data")}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "robofleet.cli",
            "bench",
            "efficiency",
            "--json",
            "--tasks",
            ",".join(TASKS),
            "--robots",
            "1",
            "--system-minutes",
            "1.25",  # robots take tens of seconds to start on a loaded 2-core machine
            "--sync-max-steps",
            "400",
            "--bc-labels",
            "200,400",
            "--eval-episodes",
            "3",
            "--target",
            str(PLUMBING_TARGET),
            "--out",
            str(tmp_path / "out"),
            "--weight-apply-at",
            "chunk_boundary",
            "--publish-every-updates",
            "10",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=560,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    s = json.loads(out.stdout.strip().splitlines()[-1])
    assert "labels_ratio_vs_bc" in "\n".join(out.stdout.splitlines()[:-1])  # the table
    raw = json.loads((tmp_path / "out" / "efficiency_raw.json").read_text())
    assert s["target_success"] == PLUMBING_TARGET and s["tasks"] == TASKS
    sync, system, bc = raw["sync"], raw["system"], raw["bc"]
    assert s["sync_env_steps_to_target"] == sync["env_steps_to_target"]
    assert s["system_labels_to_target"] == system["labels_to_target"]
    assert s["bc_labels_to_target"] == bc["labels_to_target"]
    assert system["acked_lost"] == 0
    assert system["env_steps"] > 0 and system["history"], "the system run evaluated nothing"
    # Unreached means null plus the best success, never a number.
    for name, r in (("sync", sync), ("system", system)):
        if r["env_steps_to_target"] is None:
            assert s[f"{name}_best_success"] < PLUMBING_TARGET
        else:
            assert max(h["success_mean"] for h in r["history"]) >= PLUMBING_TARGET
    a, b = s["system_env_steps_to_target"], s["sync_env_steps_to_target"]
    if a is None or not b:
        assert s["steps_ratio_vs_sync"] is None
    else:
        assert s["steps_ratio_vs_sync"] == pytest.approx(a / b, abs=1e-3)
    a, b = s["system_labels_to_target"], s["bc_labels_to_target"]
    if a is None or not b:
        assert s["labels_ratio_vs_bc"] is None
    else:
        assert s["labels_ratio_vs_bc"] == pytest.approx(a / b, abs=1e-3)
    assert [h["labels"] for h in bc["history"]][0] >= 200
    # the cadence asked for is the one the system ran, and its robots reported their figures
    assert s["system_weight_apply_at"] == "chunk_boundary"
    assert s["system_publish_every_updates"] == 10
    sched = s["system_schedule"]
    assert sched["robot_steps"] > 0 and 0 <= sched["intervention_rate"] <= 1
    assert sched["version_lag_mean"] is not None and sched["version_lag_mean"] >= 0
    assert set(sched) == set(s["sync_schedule"])


def test_system_schedule_weights_each_robot_by_its_steps() -> None:
    robots = [
        {"steps": 300, "episodes": 3, "interventions": 90, "version_lag_mean": 1.0,
         "stale_steps": 150, "weight_swaps": 2, "apply_delay_mean_s": 2.0},
        {"steps": 100, "episodes": 1, "interventions": 10, "version_lag_mean": 0.0,
         "stale_steps": 0, "weight_swaps": 6, "apply_delay_mean_s": 0.0},
    ]  # fmt: skip
    progress = {"learner_step": 300 + 200, "policy_version": 5}
    sched = _system_schedule(robots, progress, 400, {"versions_published": 5})
    assert sched["updates_per_env_step"] == 0.5  # 200 updates after the 300 BC ones
    assert sched["env_steps_per_version"] == 100.0  # 4 versions after the first
    assert sched["labels_per_episode"] == 25.0 and sched["intervention_rate"] == 0.25
    assert sched["version_lag_mean"] == 0.75 and sched["stale_step_fraction"] == 0.375
    assert sched["apply_delay_mean_s"] == 0.5 and sched["robot_steps"] == 400


def test_scaling_reports_medians_of_interleaved_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--scaling --repeats: runs interleave by count; a count's time is the median of its runs
    with an unreached run as infinitely slow; efficiency = (T1 / TN) / N."""
    import robofleet.bench.efficiency as be

    times = {1: [200.0, 240.0, None], 8: [30.0, None, None]}
    order: list[int] = []

    def fake_run_system(tasks: object, robots: int, minutes: float, **kw: object) -> dict:
        t = times[robots][sum(1 for n in order if n == robots)]
        order.append(robots)
        hist = [{"wall_s": 0.0, "success_mean": 0.3}]
        if t is not None:
            hist.append({"wall_s": t, "success_mean": 0.95})
        return {
            "robots": robots,
            "history": hist,
            "wall_s_to_target": t,
            "env_steps_to_target": None if t is None else int(t * 20 * robots),
            "env_steps_per_s_per_robot_to_target": None if t is None else 20.0,
        }

    monkeypatch.setattr(be, "run_system", fake_run_system)
    args = be.build_parser().parse_args(
        ["--scaling", "--robots-list", "1,8", "--repeats", "3", "--out", str(tmp_path)]
    )
    summary = be.scaling(args, tmp_path)
    assert order == [1, 8, 1, 8, 1, 8]
    rows = {r["robots"]: r for r in summary["rows"]}
    assert rows[1]["wall_s_to_target"] == 240.0  # median of 200, 240, inf
    assert rows[1]["wall_s_each"] == "200.0 / 240.0 / -"
    assert (
        rows[1]["env_steps_to_target"] == 4800
        and rows[1]["env_steps_per_s_per_robot_to_target"] == 20.0
    )
    assert rows[8]["wall_s_to_target"] is None  # two of three never reached it
    assert rows[8]["efficiency"] is None and summary["efficiency_at_max_robots"] is None
    assert len((tmp_path / "scaling_runs.jsonl").read_text().splitlines()) == 6
    assert (tmp_path / "scaling.png").stat().st_size > 0

    times[8] = [30.0, 40.0, None]
    order.clear()
    (tmp_path / "scaling_runs.jsonl").unlink()
    summary = be.scaling(args, tmp_path)
    rows = {r["robots"]: r for r in summary["rows"]}
    assert rows[8]["wall_s_to_target"] == 40.0
    assert rows[8]["speedup"] == 6.0 and rows[8]["efficiency"] == 0.75
    assert summary["efficiency_at_max_robots"] == 0.75
