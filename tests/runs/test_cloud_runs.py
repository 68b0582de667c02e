"""Runs on a real ``robofleet cloud`` process tree with simulated robots (real Ray, gRPC,
Meta-World, buffer, learner process); crashes are SIGKILLs of real processes."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.fakes.cloud import RobofleetCloud, cli, store_for
from tests.fakes.procs import alive, descendants
from tests.runs.helpers import (
    LIVE,
    active_lease_robots,
    events,
    launch,
    progress,
    run_state,
    spec_file,
    stop_and_report,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_two_runs_on_disjoint_robots_and_a_sigkilled_learner_resumes_by_itself(
    tmp_path: Path,
) -> None:
    cloud = RobofleetCloud(tmp_path, sim_robots=2)
    store = store_for(tmp_path)
    try:
        a = launch(tmp_path, spec_file(tmp_path / "a.yaml", "a", 1))
        b = launch(tmp_path, spec_file(tmp_path / "b.yaml", "b", 1))
        wait_until(lambda: all(run_state(store, r) in LIVE for r in (a, b)), 150, cloud.fail_text)
        robots_a, robots_b = active_lease_robots(store, a), active_lease_robots(store, b)
        assert len(robots_a) == len(robots_b) == 1
        assert robots_a.isdisjoint(robots_b)
        wait_until(lambda: all(progress(store, r).get("env_steps", 0) > 30 for r in (a, b)), 90)

        # SIGKILL run a's learner: its supervisor restarts it from the last checkpoint.
        pid = int(events(store, a, "learner.started")[-1]["pid"])
        versions_before = len(events(store, a, "learner.published"))
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: bool(events(store, a, "learner.restarted")), 60, cloud.fail_text)
        died = events(store, a, "learner.died")
        assert died and died[-1]["how"] == "signal 9"
        wait_until(
            lambda: len(events(store, a, "learner.published")) > versions_before + 2,
            60,
            cloud.fail_text,
        )
        steps = progress(store, a)["env_steps"]
        wait_until(lambda: progress(store, a)["env_steps"] > steps + 30, 60)
        assert run_state(store, a) in LIVE and run_state(store, b) in LIVE
        assert events(store, b, "learner.died") == []  # the other run never noticed

        for r in (a, b):  # both end at once
            out = cli(tmp_path, "run", "stop", r)
            assert out.returncode == 0, out.stderr
        report_a = stop_and_report(tmp_path, store, a, cloud, requested=True)
        report_b = stop_and_report(tmp_path, store, b, cloud, requested=True)
        assert report_a["acked_lost"] == report_b["acked_lost"] == 0
        assert report_a["learner_restarts"] == 1 and report_b["learner_restarts"] == 0
        assert report_a["initial_success"] is not None
    finally:
        cloud.stop()


def test_whole_cloud_killed_and_started_again_resumes_the_run(tmp_path: Path) -> None:
    cloud = RobofleetCloud(tmp_path, sim_robots=1)
    store = store_for(tmp_path)
    try:
        run_id = launch(tmp_path, spec_file(tmp_path / "spec.yaml", "kill-cloud", 1))
        wait_until(lambda: run_state(store, run_id) in LIVE, 120, cloud.fail_text)
        wait_until(lambda: progress(store, run_id).get("env_steps", 0) > 40, 60, cloud.fail_text)
        killed = cloud.kill_tree()
        assert len(killed) > 3  # the cloud, Ray's processes, the learner, the edge agent
        steps = progress(store, run_id)["env_steps"]
        assert run_state(store, run_id) in LIVE  # nobody marked it: the cloud just vanished
        cloud = RobofleetCloud(tmp_path, sim_robots=1)
        wait_until(lambda: bool(events(store, run_id, "run.resuming")), 60, cloud.fail_text)
        wait_until(lambda: run_state(store, run_id) in LIVE, 120, cloud.fail_text)
        wait_until(lambda: progress(store, run_id)["env_steps"] > steps + 40, 90, cloud.fail_text)
        report = stop_and_report(tmp_path, store, run_id, cloud)
        assert report["acked_lost"] == 0
        # One run, one curve: the elapsed time carried over the restart.
        assert report["env_steps"] > steps
    finally:
        cloud.stop()


def test_sigterm_stops_the_cloud_with_one_line_and_no_stack_dump(tmp_path: Path) -> None:
    """SIGTERM is how a service manager stops the cloud: with a run learning and its robot
    uploading, exit 0, one line, every process below it gone, and none of the native stack
    dump (``*** SIGTERM received``, ``PC: @``) that Ray's failure signal handler writes for a
    crash, nor any traceback of the services closing under it."""
    cloud = RobofleetCloud(tmp_path, sim_robots=1)
    store = store_for(tmp_path)
    try:
        run_id = launch(tmp_path, spec_file(tmp_path / "spec.yaml", "sigterm", 1))
        wait_until(lambda: progress(store, run_id).get("env_steps", 0) > 20, 150, cloud.fail_text)
        tree = descendants(cloud.child.pid)
        cloud.child.proc.send_signal(signal.SIGTERM)
        assert cloud.child.proc.wait(120) == 0, cloud.fail_text()
    finally:
        cloud.stop()
    log = cloud.child.output(10**9)
    assert "SIGTERM received" not in log and "PC: @" not in log, log
    assert "Traceback" not in log and "Exception" not in log, log
    assert log.count("robofleet cloud: shutting down") == 1, log
    assert log.split("robofleet cloud: ready\n")[-1].strip().count("\n") == 0, log
    wait_until(lambda: not any(alive(p) for p in tree), 60, "processes left behind")
    assert run_state(store, run_id) in LIVE  # left to resume at the next start
