"""Robot computers as a lab runs them: ``robofleet edge`` OS processes started here with no run
id, enrolled with tokens from the REST API, never Ray members; the cloud assigns them to runs
over their Control streams and releases them at the end, without restarting them."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from buffer.table.replay_buffer import ReplayBuffer
from dashboard.accounts import create_api_token, create_user
from foundation.store.accounts import Role
from foundation.store.models import Lease, Robot, RunState
from tests.fakes.cloud import ROBOFLEET, RobofleetCloud, free_port, store_for
from tests.fakes.lab_driver import write_lab_package
from tests.fakes.procs import Child
from tests.fakes.settings import FAST_RUN, cloud_env
from tests.runs.helpers import (
    active_lease_robots,
    events,
    progress,
    run_dir,
    run_state,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

LIVE = (RunState.RUNNING, RunState.DEGRADED)
ENDED = (RunState.FINISHED, RunState.STOPPED)
ARMS = ["arm-1", "arm-2"]


class Lab:
    """A cloud with its REST API, and the robot computers the test starts beside it."""

    def __init__(self, data_dir: Path, **sections: dict[str, Any]) -> None:
        self.data_dir = data_dir
        self.store = store_for(data_dir)
        self.computers: dict[str, Child] = {}
        self.args: dict[str, list[str]] = {}
        self.paths: dict[str, Path] = {}  # a computer's own packages (a lab's driver)
        self._secret = ""
        self.restart_cloud(**sections)

    def restart_cloud(self, **sections: dict[str, Any]) -> None:
        """Start the cloud (again, on the same data directory) and its REST client."""
        self.cloud = RobofleetCloud(self.data_dir, sim_robots=0, dashboard=True, **sections)
        meta = json.loads((self.data_dir / "cloud.json").read_text())
        self.grpc, self.url = str(meta["grpc"]), str(meta["dashboard"]).rstrip("/")
        if not self._secret:
            user = create_user(
                self.store, "lab-admin", "a-long-password-1", Role.ADMIN, actor="test"
            )
            _tok, self._secret = create_api_token(self.store, user.id, "test", None, actor="test")
        self.http = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {self._secret}"}, timeout=30
        )

    def enroll(self, name: str, *driver: str, pythonpath: Path | None = None) -> None:
        """A token from the REST API, then the robot computer with it (first start), with
        ``pythonpath`` first on its PYTHONPATH (only its own)."""
        got = self.http.post("/api/enrollment-tokens", json={"robot_name": name})
        assert got.status_code == 201, got.text
        self.args[name] = [
            *("edge", "--server", self.grpc, "--robot", name),
            *("--spool-dir", str(self.data_dir / "computers" / name)),
            *driver,
        ]
        if pythonpath is not None:
            self.paths[name] = pythonpath
        self.start(name, token=got.json()["token"])

    def start(self, name: str, token: str | None = None) -> None:
        argv = [*ROBOFLEET, *self.args[name], *([f"--token={token}"] if token else [])]
        env = cloud_env(self.data_dir)
        if name in self.paths:
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(self.paths[name]), env.get("PYTHONPATH")) if p
            )
        self.computers[name] = Child(
            argv, log=self.data_dir / f"{name}-{time.time_ns()}.log", lines=False, env=env
        )

    def robots(self) -> dict[str, dict[str, Any]]:
        with self.store.session() as s:
            return {r.name: dict(r.stats or {}) for r in s.query(Robot)}

    def launch(self, spec: dict[str, Any]) -> httpx.Response:
        return self.http.post("/api/runs", json=spec)

    def fail_text(self) -> str:
        tails = [f"--- {n}\n{c.output()[-1500:]}" for n, c in self.computers.items()]
        return self.cloud.fail_text()[-3000:] + "\n".join(tails)

    def close(self) -> None:
        for child in self.computers.values():
            child.stop(60)
        self.http.close()
        self.cloud.stop()
        self.store.close()


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    lab = Lab(tmp_path)
    try:
        yield lab
    finally:
        lab.close()


def hg_dagger(name: str, count: int, **extra: Any) -> dict[str, Any]:
    return {
        "version": 1,
        "name": name,
        "algorithm": "hg-dagger",
        "tasks": ["reach-v3"],
        "hyperparameters": FAST_RUN,
        "demonstrations": {"episodes_per_task": 1},
        "policy": {"hidden_sizes": [64, 64]},
        "robots": {"robot_type": "metaworld-sawyer", "count": count},
        "learner": {"num_cpus": 0.5},
        "publish": {"every_updates": 20},
        "evaluation": {"on": "robots", "every_seconds": 10, "every_episodes": 3},
        **extra,
    }


def _acting_in(lab: Lab, run_id: str, names: list[str]) -> bool:
    robots = lab.robots()
    return all(
        robots.get(n, {}).get("run_id") == run_id and robots[n].get("state") == "running"
        for n in names
    )


def _idle(lab: Lab, names: list[str]) -> bool:
    robots = lab.robots()
    return all(robots.get(n, {}).get("state") == "idle" for n in names)


def _stop(lab: Lab, run_id: str) -> dict[str, Any]:
    got = lab.http.post(f"/api/runs/{run_id}/stop")
    assert got.status_code == 200, got.text
    wait_until(lambda: run_state(lab.store, run_id) in ENDED, 180, lab.fail_text)
    assert active_lease_robots(lab.store, run_id) == set()
    return dict(json.loads((run_dir(lab.store, run_id) / "report.json").read_text()))


def _stored_once(buffer_dir: Path, robot_ids: list[int]) -> dict[int, int]:
    """Rows per robot in the run's buffer, checking that each (robot, seq) and each (robot,
    episode, frame) is stored exactly once."""
    buf = ReplayBuffer.open(buffer_dir)
    try:
        index = buf.index
        seq, robot = index.view("seq"), index.view("robot")
        episode, frame = index.view("episode_index"), index.view("frame_index")
        rows: dict[int, int] = {}
        for rid in robot_ids:
            mine = robot == index.robots.codes[str(rid)]
            assert len(np.unique(seq[mine])) == int(mine.sum()), f"robot {rid}: a seq twice"
            steps = np.stack([episode[mine], frame[mine]], axis=1)
            assert len(np.unique(steps, axis=0)) == len(steps), f"robot {rid}: a step twice"
            rows[rid] = int(mine.sum())
        return rows
    finally:
        buf.close()


def test_robot_computers_are_assigned_released_and_reassigned(lab: Lab) -> None:
    for name in ARMS:
        lab.enroll(name, "--driver", "metaworld", "--operator", "scripted")
    lab.enroll(
        "pend-1", "--driver", "gymnasium", "--driver-option", "env_id=Pendulum-v1",
        "--operator", "none",
    )  # fmt: skip
    wait_until(lambda: _idle(lab, [*ARMS, "pend-1"]), 180, lab.fail_text)
    listed = {r["name"]: r for r in lab.http.get("/api/robots").json()}
    assert set(listed) == {*ARMS, "pend-1"}
    ids = {name: int(listed[name]["id"]) for name in ARMS}

    # Robots one policy cannot share are refused at launch, by feature; nothing is leased.
    with lab.store.session() as s:  # one lab's robots, tagged alike (a run selects by tag)
        for robot in s.query(Robot):
            robot.tags = {**robot.tags, "lab": "a"}
    mixed = hg_dagger("mixed", 3, robots={"tags": {"lab": "a"}, "count": 3})
    got = lab.launch(mixed)
    assert got.status_code == 422, got.text
    assert "observation.state" in got.text and "pend-1" in got.text
    # HG-DAgger needs an operator on every robot.
    lonely = hg_dagger("no-operator", 1, robots={"robot_type": "pendulum-v1", "count": 1})
    lonely["tasks"] = ["pendulum-v1"]
    got = lab.launch(lonely)
    assert got.status_code == 422 and "no operator" in got.text, got.text
    assert '"demonstrations","episodes_per_task"' in got.text  # nobody to demonstrate either
    with lab.store.session() as s:
        assert s.query(Lease).filter(Lease.released_at.is_(None)).count() == 0

    # An HG-DAgger run on the two arms: both are assigned and act in it.
    got = lab.launch(hg_dagger("arms", 2))
    assert got.status_code == 201, got.text
    run_id = got.json()["id"]
    wait_until(lambda: run_state(lab.store, run_id) in LIVE, 240, lab.fail_text)
    wait_until(lambda: _acting_in(lab, run_id, ARMS), 120, lab.fail_text)
    wait_until(lambda: progress(lab.store, run_id).get("env_steps", 0) > 200, 120, lab.fail_text)
    first_pid = lab.computers["arm-2"].pid
    # Success comes from the robots' own policy-only evaluation episodes (no simulator).
    evals = run_dir(lab.store, run_id) / "evals.jsonl"
    wait_until(
        lambda: evals.exists() and '"source": "robots"' in evals.read_text(), 180, lab.fail_text
    )
    point = json.loads(evals.read_text().splitlines()[-1])
    assert set(point["success"]) == {"reach-v3"} and point["episodes"]["reach-v3"] >= 1

    # SIGKILL one robot computer mid-run and start it again: it is assigned again and acts.
    lab.computers["arm-1"].kill()
    lab.start("arm-1")
    wait_until(lambda: len(events(lab.store, run_id, "robot.joined")) >= 3, 180, lab.fail_text)
    wait_until(lambda: _acting_in(lab, run_id, ARMS), 120, lab.fail_text)
    robots = lab.robots()
    assert all(robots[n].get("steps", 0) > 0 for n in ARMS)
    with lab.store.session() as s:
        applied = {r.name: r.applied_policy_version for r in s.query(Robot) if r.name in ARMS}
    assert all((v or 0) > 1 for v in applied.values()), applied  # both apply new versions

    report = _stop(lab, run_id)
    assert report["acked_lost"] == 0
    # the robots' human cost, from each computer's final report (runs.human_cost)
    assert report["human_cost"]["robots"] and set(report["human_cost"]["robots"]) <= set(ARMS)
    wait_until(lambda: _idle(lab, ARMS), 120, lab.fail_text)
    # Each robot's steps landed under its own id, none stored twice.
    rows = _stored_once(run_dir(lab.store, run_id) / "buffer", list(ids.values()))
    assert all(n > 0 for n in rows.values()), rows

    # A second run on the same computers, not restarted: assigned again, acts again.
    assert lab.computers["arm-2"].pid == first_pid
    assert lab.computers["arm-2"].proc.poll() is None
    got = lab.launch(hg_dagger("again", 1))
    assert got.status_code == 201, got.text
    second = got.json()["id"]
    wait_until(lambda: run_state(lab.store, second) in LIVE, 240, lab.fail_text)
    wait_until(
        lambda: any(lab.robots()[n].get("run_id") == second for n in ARMS), 60, lab.fail_text
    )
    wait_until(lambda: progress(lab.store, second).get("env_steps", 0) > 50, 120, lab.fail_text)
    assert _stop(lab, second)["acked_lost"] == 0
    assert lab.computers["arm-2"].pid == first_pid  # never restarted

    # SAC on the Gymnasium robot (operator none), idle all along: it trains from scratch.
    # Evaluated on the robot, nothing would score its episodes: refused by field.
    got = lab.launch({**_sac_on_pendulum(), "evaluation": {"on": "robots"}})
    assert got.status_code == 422 and "evaluation" in got.text and "pend-1" in got.text
    got = lab.launch(_sac_on_pendulum())
    assert got.status_code == 201, got.text
    sac = got.json()["id"]
    wait_until(lambda: run_state(lab.store, sac) in LIVE, 240, lab.fail_text)
    wait_until(lambda: _acting_in(lab, sac, ["pend-1"]), 120, lab.fail_text)
    wait_until(lambda: len(events(lab.store, sac, "learner.published")) >= 4, 240, lab.fail_text)
    with lab.store.session() as s:
        pend = s.query(Robot).filter(Robot.name == "pend-1").one()
        assert (pend.applied_policy_version or 0) > 1  # online versions reach the robot
    assert _stop(lab, sac)["acked_lost"] == 0


def test_a_labs_own_driver_runs_a_whole_run(lab: Lab, tmp_path: Path) -> None:
    """A robot computer whose driver is a lab's package outside the repository (``--driver
    labarm.arms:LabArm``, importable on that computer only) enrolls, is assigned a SAC run,
    acts with the versions the run publishes, scores its own evaluation episodes and is
    released when the run stops."""
    site = tmp_path / "lab-site"
    driver = write_lab_package(site)
    lab.enroll(
        "slider-1", "--driver", driver, "--operator", "none", pythonpath=site
    )  # fmt: skip
    wait_until(lambda: _idle(lab, ["slider-1"]), 180, lab.fail_text)
    listed = {r["name"]: r for r in lab.http.get("/api/robots").json()}
    assert listed["slider-1"]["robot_type"] == "lab-arm"

    got = lab.launch(
        {
            "version": 1,
            "name": "slider",
            "algorithm": "sac",
            "tasks": ["slide"],
            "hyperparameters": FAST_RUN,
            "policy": {"hidden_sizes": [64, 64]},
            "buffer": {"min_size": 64},
            "robots": {"robot_type": "lab-arm", "count": 1},
            "learner": {"num_cpus": 0.5},
            "publish": {"every_updates": 20},
            "evaluation": {"every_seconds": 5, "every_episodes": 2},
        }
    )
    assert got.status_code == 201, got.text
    run_id = got.json()["id"]
    wait_until(lambda: _acting_in(lab, run_id, ["slider-1"]), 240, lab.fail_text)
    wait_until(lambda: len(events(lab.store, run_id, "learner.published")) >= 3, 240, lab.fail_text)
    evals = run_dir(lab.store, run_id) / "evals.jsonl"
    wait_until(
        lambda: evals.exists() and '"source": "robots"' in evals.read_text(), 180, lab.fail_text
    )
    assert set(json.loads(evals.read_text().splitlines()[-1])["success"]) == {"slide"}
    with lab.store.session() as s:
        robot = s.query(Robot).filter(Robot.name == "slider-1").one()
        assert (robot.applied_policy_version or 0) > 1  # online versions reach the lab's arm
        assert robot.spec["capabilities"]["reward"] == "dense"
        robot_id = robot.id
    assert _stop(lab, run_id)["acked_lost"] == 0
    wait_until(lambda: _idle(lab, ["slider-1"]), 120, lab.fail_text)
    rows = _stored_once(run_dir(lab.store, run_id) / "buffer", [robot_id])
    assert rows[robot_id] > 0
    buf = ReplayBuffer.open(run_dir(lab.store, run_id) / "buffer")
    try:  # the lab's driver's own dense reward (-distance to the goal) is what was stored
        rewards = buf.index.view("reward").copy()
    finally:
        buf.close()
    assert float(rewards.min()) < 0.0 and float(rewards.max()) <= 0.0


def test_robots_keep_spooling_while_the_cloud_is_down_and_rejoin_the_resumed_run(
    tmp_path: Path,
) -> None:
    port = free_port()  # the robot computer keeps dialing the same address
    lab = Lab(tmp_path, comms={"grpc_port": port})
    try:
        lab.enroll("arm-1", "--driver", "metaworld", "--operator", "scripted")
        wait_until(lambda: _idle(lab, ["arm-1"]), 180, lab.fail_text)
        got = lab.launch(hg_dagger("outage", 1))
        assert got.status_code == 201, got.text
        run_id = got.json()["id"]
        wait_until(lambda: _acting_in(lab, run_id, ["arm-1"]), 240, lab.fail_text)
        wait_until(lambda: progress(lab.store, run_id).get("env_steps", 0) > 100, 120)

        lab.cloud.kill_tree()  # the cloud vanishes; the robot computer is not its child
        spool = lab.data_dir / "computers" / "arm-1" / "runs" / run_id
        acked = _spool_state(spool)["acked_seq"]
        wait_until(lambda: _spool_next_seq(spool) > acked + 100, 60)  # still acting, spooling
        assert lab.computers["arm-1"].proc.poll() is None

        lab.restart_cloud(comms={"grpc_port": port})
        wait_until(lambda: run_state(lab.store, run_id) in LIVE, 240, lab.fail_text)
        wait_until(lambda: _spool_state(spool)["acked_seq"] > acked + 100, 120, lab.fail_text)
        report = _stop(lab, run_id)
        assert report["acked_lost"] == 0
        wait_until(lambda: _idle(lab, ["arm-1"]), 120, lab.fail_text)
        state = _spool_state(spool)
        assert state["acked_seq"] == _spool_next_seq(spool) - 1  # drained at release
    finally:
        lab.close()


def _spool_state(spool: Path) -> dict[str, Any]:
    return dict(json.loads((spool / "state.json").read_text()))


def _spool_next_seq(spool: Path) -> int:
    """``next_seq`` as the robot's spool files say (``batches/<first>-<last>.arrow``)."""
    lasts = [int(f.stem.split("-")[1]) for f in (spool / "batches").glob("*-*.arrow")]
    return max([int(_spool_state(spool)["next_seq"]), *(n + 1 for n in lasts)])


def _sac_on_pendulum() -> dict[str, Any]:
    """SAC from scratch (no demonstrations) on a Gymnasium robot with a 3-d observation."""
    return {
        "version": 1,
        "name": "pendulum",
        "algorithm": "sac",
        "tasks": ["pendulum-v1"],
        "hyperparameters": {**FAST_RUN, "max_episode_steps": 100},
        "policy": {"hidden_sizes": [64, 64]},
        "buffer": {"min_size": 64},
        "robots": {"robot_type": "pendulum-v1", "count": 1},
        "learner": {"num_cpus": 0.5},
        "publish": {"every_updates": 20},
        # Pendulum reports no success and nobody labels it: success is not measured.
        "evaluation": {"on": "none"},
    }
