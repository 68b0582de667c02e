"""Pause keeps leases, and a hung learner is detected, on a real ``robofleet cloud`` process tree
(real Ray, gRPC Control stream, Meta-World, buffer, learner process). The learner hangs for
real: SIGSTOP."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from buffer import ReplayBuffer
from foundation.store.metadata_store import MetadataStore
from foundation.store.models import Lease, Robot, RobotStatus, RunState
from runs.accounting import acked_lost, acked_total
from tests.fakes.cloud import RobofleetCloud, cli, store_for
from tests.runs.helpers import (
    LIVE,
    events,
    progress,
    run_dir,
    run_spools,
    run_state,
    spec_file,
    start_run,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

HANG_S = 30  # generous for a restarted learner's imports on a loaded 2-core machine


def _open_leases(store: MetadataStore, run_id: str) -> set[int]:
    """Ids of the run's unreleased lease rows (a re-lease would make new ones)."""
    with store.session() as s:
        return set(
            s.scalars(select(Lease.id).where(Lease.run_id == run_id, Lease.released_at.is_(None)))
        )


def _robot_statuses(store: MetadataStore) -> set[RobotStatus]:
    with store.session() as s:
        return set(s.scalars(select(Robot.status)))


def _ok(*args: str, data_dir: Path) -> str:
    out = cli(data_dir, *args)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_pause_keeps_leases_and_a_hung_learner_is_killed_and_resumed(tmp_path: Path) -> None:
    cloud = RobofleetCloud(tmp_path, sim_robots=1, orchestration={"learner_hang_s": HANG_S})
    store = store_for(tmp_path)
    try:
        spec = spec_file(tmp_path / "spec.yaml", "pause-hang", 1)
        run_id = start_run(tmp_path, store, spec, cloud, 30)
        leases = _open_leases(store, run_id)
        assert len(leases) == 1

        # -- pause: robots hold at a step boundary; lease, agent and robot status stay
        agents = len(events(store, run_id, "robot.assigned"))
        assert agents == 1
        _ok("run", "pause", run_id, data_dir=tmp_path)
        assert run_state(store, run_id) == RunState.PAUSED
        wait_until(lambda: bool(events(store, run_id, "run.robots_held")), 60, cloud.fail_text)
        held = events(store, run_id, "run.robots_held")[-1]
        assert held["robots"] == held["leases_kept"] and len(held["robots"]) == 1
        robot = held["robots"][0]
        time.sleep(3)  # what was recorded before the hold reaches the buffer
        steps = progress(store, run_id)["env_steps"]
        time.sleep(6)  # progress rows keep coming (every 2 s) while paused
        assert progress(store, run_id)["env_steps"] == steps  # nobody acts
        assert run_state(store, run_id) == RunState.PAUSED
        assert _open_leases(store, run_id) == leases
        assert _robot_statuses(store) == {RobotStatus.LEASED}
        assert events(store, run_id, "lease.released") == []
        assert events(store, run_id, "edge_agent.died") == []

        # -- resume: the same agent goes on, under the same lease
        _ok("resume", run_id, data_dir=tmp_path)
        wait_until(lambda: run_state(store, run_id) in LIVE, 60, cloud.fail_text)
        wait_until(lambda: progress(store, run_id)["env_steps"] > steps + 20, 90, cloud.fail_text)
        assert len(events(store, run_id, "robot.assigned")) == agents  # not assigned anew
        assert _open_leases(store, run_id) == leases
        assert len(events(store, run_id, "lease.acquired")) == 1
        (spool,) = [p for p in run_spools(tmp_path, run_id) if p.parent.parent.name == robot]
        control = spool / "control.jsonl"
        kinds = [json.loads(line)["kind"] for line in control.read_text().splitlines()]
        assert "pause" in kinds and kinds[-1] == "resume"  # what the robot itself received

        # -- hang the learner for real: alive, no progress. The watchdog kills and restarts it.
        pid = int(events(store, run_id, "learner.started")[-1]["pid"])
        published = len(events(store, run_id, "learner.published"))
        os.kill(pid, signal.SIGSTOP)
        wait_until(lambda: bool(events(store, run_id, "learner.hung")), HANG_S + 60)
        hung = events(store, run_id, "learner.hung")
        assert len(hung) == 1 and hung[0]["pid"] == pid
        assert float(hung[0]["silent_s"]) >= HANG_S
        wait_until(lambda: bool(events(store, run_id, "learner.died")), 30)  # right after
        died = events(store, run_id, "learner.died")[-1]
        assert died["pid"] == pid and died["how"] == "signal 9" and died["hung"] is True
        wait_until(lambda: bool(events(store, run_id, "learner.restarted")), 60, cloud.fail_text)
        # the run goes on: new versions from the restarted learner, robots keep acting
        wait_until(
            lambda: len(events(store, run_id, "learner.published")) > published + 2,
            120,
            cloud.fail_text,
        )
        steps = progress(store, run_id)["env_steps"]
        wait_until(lambda: progress(store, run_id)["env_steps"] > steps + 20, 60, cloud.fail_text)
        assert run_state(store, run_id) in LIVE

        # -- the cloud goes down under a paused run: it stays paused, its robot leased to it
        _ok("run", "pause", run_id, data_dir=tmp_path)
        wait_until(lambda: len(events(store, run_id, "run.robots_held")) == 2, 60)
        cloud.stop()  # SIGTERM: every run lets go of Ray; a paused one keeps its leases
        assert run_state(store, run_id) == RunState.PAUSED
        assert _open_leases(store, run_id) == leases
        assert _robot_statuses(store) == {RobotStatus.LEASED}
        assert events(store, run_id, "run.placement_suspended")

        # -- stopped with no cloud running: the leases go back, nothing acknowledged was lost
        out = _ok("run", "stop", run_id, data_dir=tmp_path)
        assert f"stopped {run_id}" in out
        assert _open_leases(store, run_id) == set()
        assert _robot_statuses(store) == {RobotStatus.IDLE}
        rdir = run_dir(store, run_id)
        learner_events = [
            (kind, events(store, run_id, kind))
            for kind in ("learner.hung", "learner.died", "learner.restarted")
        ]
        restarts = json.loads((rdir / "progress.json").read_text())["learner_restarts"]
        assert restarts == 1, f"{learner_events}\n{(rdir / 'learner.log').read_text()[-3000:]}"
        buffer = ReplayBuffer.open(rdir / "buffer")
        try:
            assert acked_total(run_spools(tmp_path, run_id)) > 0
            assert acked_lost(buffer, run_spools(tmp_path, run_id)) == 0
        finally:
            buffer.close()
        assert len(events(store, run_id, "learner.hung")) == 1
    finally:
        cloud.stop()
        store.close()
