"""LeRobot's unmodified HIL-SERL actors in one robofleet run: two ``python -m lerobot.rl.actor``
processes of the installed package, each acting in gym-hil's simulated Panda (MuJoCo offscreen,
no display) beside its own ``robofleet lerobot-gateway``, in a ``lerobot-sac`` run launched
through the REST API of a real ``robofleet cloud``. Both actors' transitions are stored under
their own robots, both load the run's versions, a third arm enrolled mid-run joins the run at
once, and an actor that replaces a SIGKILLed one is served (``Ready`` answers it, its
transitions are stored)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from sqlalchemy.exc import OperationalError

from buffer.table.replay_buffer import ReplayBuffer
from dashboard.accounts import create_api_token, create_user
from foundation.store.accounts import Role
from foundation.store.models import Robot, RunState
from tests.fakes.cloud import ROBOFLEET, RobofleetCloud, free_port, store_for
from tests.fakes.procs import Child
from tests.fakes.settings import cloud_env
from tests.runs.helpers import active_lease_robots, run_dir, run_state, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ARMS = ["panda-a", "panda-b"]
LATE_ARM = "panda-c"  # enrolled and started while the run trains
STATE_DIM, ACTION_DIM = 18, 4  # gym-hil's agent_pos; end-effector x, y, z and gripper
POLICY: dict[str, Any] = {
    "hidden_sizes": [16],
    "config": {
        "latent_dim": 8,
        "state_min": [-10.0] * STATE_DIM,
        "state_max": [10.0] * STATE_DIM,
        "action_min": [-1.0, -1.0, -1.0, 0.0],
        "action_max": [1.0, 1.0, 1.0, 2.0],
    },
}
LOADED = "[ACTOR] Load new parameters from Learner."


def run_spec() -> dict[str, Any]:
    return {
        "version": 1,
        "name": "lerobot-pandas",
        "algorithm": "lerobot-sac",
        "tasks": ["pick-cube"],
        "robots": {"robot_type": "lerobot-actor", "count": len(ARMS) + 1, "min_count": len(ARMS)},
        "policy": POLICY,
        "hyperparameters": {"batch_size": 8, "bc_updates": 0, "updates_per_s": 5},
        "buffer": {"min_size": 8},
        "learner": {"num_cpus": 0.5},
        "publish": {"every_updates": 5},
        "evaluation": {"on": "none"},
    }


def lerobot_config(out: Path, port: int) -> dict[str, Any]:
    """LeRobot's ``TrainRLServerPipelineConfig`` JSON for one actor: gym-hil's pick-cube
    through LeRobot's ``gym_manipulator`` env (no viewer, no teleoperator), its policy the
    run's (state only; the env's cameras are rendered but not an input), learner at ``port``."""
    import draccus

    from cloud_learner.policies.lerobot_gaussian import gaussian_actor_config

    cfg = gaussian_actor_config(STATE_DIM, ACTION_DIM, [], (0, 0), **POLICY)
    policy = json.loads(json.dumps(draccus.encode(cfg)))
    policy.update(
        type="gaussian_actor",
        online_steps=1_000_000,
        push_to_hub=False,
        concurrency={"actor": "threads", "learner": "threads"},
        actor_learner_config={"learner_host": "127.0.0.1", "learner_port": port},
    )
    env = {
        "type": "gym_manipulator",
        "name": "gym_hil",
        "task": "PandaPickCube-v0",
        "fps": 10,
        "features": {"action": {"type": "ACTION", "shape": [ACTION_DIM]}},
        "features_map": {"action": "action"},
        "processor": {
            "gripper": {"use_gripper": True, "gripper_penalty": 0.0},
            "reset": {"control_time_s": 0.8, "reset_time_s": 0.0},
        },
    }
    return {
        "output_dir": str(out),
        "job_name": out.name,
        "seed": 1,
        "dataset": {"repo_id": "lab/pandas"},  # required by LeRobot's config, never read
        "env": env,
        "policy": policy,
    }


class Lab:
    """A cloud with its REST API; per arm a gateway and LeRobot's actor beside it."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.store = store_for(data_dir)
        self.cloud = RobofleetCloud(data_dir, sim_robots=0, dashboard=True)
        meta = json.loads((data_dir / "cloud.json").read_text())
        self.grpc, url = str(meta["grpc"]), str(meta["dashboard"]).rstrip("/")
        user = create_user(self.store, "lab-admin", "a-long-password-1", Role.ADMIN, actor="t")
        _tok, secret = create_api_token(self.store, user.id, "test", None, actor="t")
        self.http = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {secret}"}, timeout=30
        )
        self.children: dict[str, Child] = {}
        self.configs: dict[str, Path] = {}

    def gateway(self, name: str) -> None:
        """Write the arm's LeRobot config; enroll its gateway with a REST API token."""
        config = self.data_dir / f"{name}.json"
        out = self.data_dir / "actors" / name
        config.write_text(json.dumps(lerobot_config(out, free_port())))
        self.configs[name] = config
        got = self.http.post("/api/enrollment-tokens", json={"robot_name": name})
        assert got.status_code == 201, got.text
        argv = [
            *(*ROBOFLEET, "lerobot-gateway", "--server", self.grpc, "--robot", name),
            *("--token", got.json()["token"], "--lerobot-config", str(config)),
            *("--spool-dir", str(self.data_dir / "gateways" / name)),
        ]
        self._start(f"gateway-{name}", argv)

    def actor(self, name: str, attempt: int = 0) -> Child:
        """``python -m lerobot.rl.actor --config_path=<the arm's config>``, unmodified."""
        data = json.loads(self.configs[name].read_text())
        data["output_dir"] = str(self.data_dir / "actors" / f"{name}-{attempt}")
        self.configs[name].write_text(json.dumps(data))
        argv = [sys.executable, "-m", "lerobot.rl.actor", f"--config_path={self.configs[name]}"]
        return self._start(f"actor-{name}", argv, MUJOCO_GL="egl")

    def _start(self, key: str, argv: list[str], **env: str) -> Child:
        log = self.data_dir / f"{key}-{time.time_ns()}.log"
        child = Child(argv, log=log, lines=False, env={**cloud_env(self.data_dir), **env})
        self.children[key] = child
        return child

    def robots(self) -> dict[str, dict[str, Any]]:
        # The cloud writes the same SQLite file; on a loaded machine a read can outwait its
        # busy timeout ("database is locked"): the poll asks again.
        for attempt in range(10):
            try:
                with self.store.session() as s:
                    return {r.name: {"id": r.id, **(r.stats or {})} for r in s.query(Robot)}
            except OperationalError as exc:
                if "locked" not in str(exc) or attempt == 9:
                    raise
                time.sleep(1.0)
        raise AssertionError("unreachable")

    def fail_text(self) -> str:
        tails = [f"--- {k}\n{c.output()[-1500:]}" for k, c in self.children.items()]
        return self.cloud.fail_text()[-2500:] + "\n".join(tails)

    def close(self) -> None:
        # LeRobot's parameter stream notices SIGTERM only at its next message: a short wait,
        # then SIGKILL; the gateways after their actors.
        for key in sorted(self.children, key=lambda k: not k.startswith("actor")):
            self.children[key].stop(5 if key.startswith("actor") else 60)
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


def _stat(lab: Lab, name: str, key: str) -> float:
    return float(lab.robots().get(name, {}).get(key, 0) or 0)


def _running(lab: Lab) -> bool:
    """True; fails at once when a gateway or an actor has ended (its log in the message)."""
    for key, child in lab.children.items():
        assert child.proc.poll() is None, f"{key} ended: {child.output(3000)}"
    return True


def _loaded(child: Child) -> int:
    return child.output(10**9).count(LOADED)


def test_unmodified_lerobot_actors_train_one_run_a_third_joins_a_killed_one_is_replaced(
    lab: Lab,
) -> None:
    for name in ARMS:
        lab.gateway(name)
    wait_until(
        lambda: all(lab.robots().get(n, {}).get("state") == "idle" for n in ARMS),
        180,
        lab.fail_text,
    )
    got = lab.http.post("/api/runs", json=run_spec())
    assert got.status_code in (200, 201), got.text
    run_id = str(got.json()["id"])
    actors = {name: lab.actor(name) for name in ARMS}

    # Both actors pass Ready, act, and their episodes land under their own robots; both load
    # versions the run trained after the first.
    def served() -> bool:
        _running(lab)
        return all(
            _stat(lab, n, "lerobot.transitions_stored") >= 10
            and _stat(lab, n, "lerobot.handed_version") >= 2
            and _stat(lab, n, "lerobot.interactions") >= 1
            and _loaded(actors[n]) >= 2
            for n in ARMS
        )

    wait_until(served, 420, lab.fail_text)
    listed = {r["name"]: r["activity"] for r in lab.http.get("/api/robots").json()}
    assert {n: listed[n]["run_id"] for n in ARMS} == dict.fromkeys(ARMS, run_id), listed

    # A third arm joins mid-run: its gateway is enrolled, the run leases it (count 3, started
    # with 2), its actor passes Ready and loads the run's current version at once.
    lab.gateway(LATE_ARM)
    actors[LATE_ARM] = lab.actor(LATE_ARM)
    wait_until(
        lambda: (
            _running(lab)
            and _stat(lab, LATE_ARM, "lerobot.transitions_stored") >= 10
            and _loaded(actors[LATE_ARM]) >= 1
        ),
        300,
        lab.fail_text,
    )
    assert _stat(lab, LATE_ARM, "lerobot.handed_version") >= 2  # the run's, not a first one

    # SIGKILL one actor; its replacement passes Ready at once and its episodes are stored.
    victim = ARMS[1]
    before = _stat(lab, victim, "lerobot.transitions_stored")
    actors[victim].kill()
    actors[victim] = lab.actor(victim, attempt=1)
    wait_until(
        lambda: (
            _running(lab)
            and _stat(lab, victim, "lerobot.transitions_stored") >= before + 5
            and _loaded(actors[victim]) >= 1
        ),
        240,
        lab.fail_text,
    )

    got = lab.http.post(f"/api/runs/{run_id}/stop")
    assert got.status_code == 200, got.text
    wait_until(
        lambda: run_state(lab.store, run_id) in (RunState.FINISHED, RunState.STOPPED),
        180,
        lab.fail_text,
    )
    assert active_lease_robots(lab.store, run_id) == set()
    ids = {n: str(lab.robots()[n]["id"]) for n in [*ARMS, LATE_ARM]}
    buf = ReplayBuffer.open(run_dir(lab.store, run_id) / "buffer", read_only=True)
    try:
        steps = buf.read_transitions(buf.select(), count=False)
    finally:
        buf.close()
    robot = np.array([str(r) for r in steps["robot_id"]])
    for name, rid in ids.items():
        mine = robot == rid
        assert mine.sum() >= 10, f"{name}: {int(mine.sum())} rows stored"
        where = np.stack([steps["episode_index"][mine], steps["frame_index"][mine]], axis=1)
        assert len(np.unique(where, axis=0)) == len(where), f"{name}: a step stored twice"
        # No operator drives gym-hil here: LeRobot's actor flags no step, and none is flagged.
        assert not np.asarray(steps["is_intervention"][mine]).any(), name
        assert np.asarray(steps["policy_version"][mine]).max() >= 2, name
        assert np.asarray(steps["observation.state"][mine]).shape[1:] == (STATE_DIM,)
