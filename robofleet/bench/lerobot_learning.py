"""The learning side of ``robofleet bench lerobot``: LeRobot's own learner and robofleet, each
training one unmodified LeRobot actor in gym-hil's simulated Panda, for the same wall-clock
budget, one after the other on this machine.

Both sides run the same processes of the installed ``lerobot`` package with the same
``TrainRLServerPipelineConfig`` (:func:`lerobot_config`): ``python -m lerobot.rl.actor`` acting
in ``gym_hil/PandaPickCube-v0`` (MuJoCo offscreen, no operator; a sparse reward, 1.0 when the
cube is lifted, which also ends the episode), a state-only ``gaussian_actor`` policy, LeRobot's
SAC with the same widths, learning rates, batch size, learning start and parameter-push
period, and the same offline data: scripted demonstrations (:func:`demonstrations`) as a
LeRobotDataset, which LeRobot's learner requires and mixes half and half with its online
buffer, and which robofleet's run mounts (``buffer.offline_data``, online fraction 0.5):

* **LeRobot**: ``python -m lerobot.rl.learner`` with that config (its RAM replay buffers, no
  checkpoints);
* **robofleet**: a fresh local cloud (:class:`robofleet.cloud.CloudService`, no dashboard) with
  a ``lerobot-sac`` run (LeRobot's own SAC and policy in ``cloud_learner``) and one
  ``robofleet lerobot-gateway`` process beside the actor.

The clock starts when the actor process starts (its environment and policy are built inside
the budget on both sides) and stops ``minutes`` later. Success over time is read from what
both sides' actors log for each finished episode (``[ACTOR] Global step N: Episode reward:
R``): an episode succeeded when R >= 1. Learner updates: LeRobot's learner logs one line per
optimization step; robofleet's is the run's ``learner_step``. Versions the actor loaded: its
``Load new parameters from Learner.`` lines.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

STATE_DIM, ACTION_DIM = 18, 4  # gym-hil's agent_pos; end-effector x, y, z and gripper
ENV_FPS = 10
# The Gaussian actor both sides train (robofleet run spec ``policy`` section).
POLICY: dict[str, Any] = {
    "hidden_sizes": [64, 64],
    "config": {
        "latent_dim": 64,
        "state_min": [-10.0] * STATE_DIM,
        "state_max": [10.0] * STATE_DIM,
        "action_min": [-1.0, -1.0, -1.0, 0.0],
        "action_max": [1.0, 1.0, 1.0, 2.0],
    },
}
BATCH_SIZE = 64
PUSH_EVERY_S = 4  # LeRobot's policy_parameters_push_frequency default
EPISODE = re.compile(r"\[ACTOR\] Global step (\d+): Episode reward: (-?[\d.eE+-]+)")
LOADED = "[ACTOR] Load new parameters from Learner."
LEROBOT_UPDATE = "[LEARNER] Optimization frequency loop"
SUCCESS_REWARD = 1.0
DEMO_REPO = "bench/panda-pick-demos"
DEMO_TASK = "pick-cube"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _expert_action(obs: dict[str, Any], phase: list[int], rng: Any, noise: float) -> Any:
    """A scripted pick for gym-hil's cube: over it, down, close (gripper 2.0) for 7 steps,
    up; the phase lives in ``phase`` ([stage, steps closed]). ``agent_pos[-3:]`` is the
    gripper's pinch site, ``environment_state`` the cube's position (metres)."""
    import numpy as np

    tcp, cube = obs["agent_pos"][-3:], obs["environment_state"]
    d = cube - tcp
    if phase[0] == 0:  # over the cube, 5 cm above it, open
        xyz = np.r_[d[:2] * 40, (cube[2] + 0.05 - tcp[2]) * 40]
        grip = 0.0
        phase[0] = 1 if np.linalg.norm(d[:2]) < 0.008 else 0
    elif phase[0] == 1:  # down to it, open
        xyz, grip = d * 40, 0.0
        phase[0] = 2 if abs(d[2]) < 0.008 else 1
    elif phase[0] == 2:  # close
        xyz, grip = np.zeros(3), 2.0
        phase[1] += 1
        phase[0] = 3 if phase[1] > 6 else 2
    else:  # lift
        xyz, grip = np.array([0.0, 0.0, 1.0]), 2.0
    xyz = np.clip(xyz + rng.normal(0.0, noise, 3), -1.0, 1.0)
    return np.r_[xyz, grip].astype(np.float32)


def demonstrations(root: Path, episodes: int, seed: int = 0, noise: float = 0.1) -> Path:
    """``episodes`` scripted picks (:func:`_expert_action`, Gaussian noise ``noise`` on the
    moves) in gym-hil's ``PandaPickCube-v0`` (the actor's environment and action space),
    written as a LeRobotDataset v3 at ``root`` (``observation.state`` (18,) float32,
    ``action`` (4,) float32, ``next.reward`` (1,) float32, ``next.done`` (1,) bool): the
    offline data both sides mount (LeRobot's learner requires a dataset).

    Returns:
        ``root``.
    """
    import gym_hil  # noqa: F401  (registers gym_hil/*)
    import gymnasium as gym
    import numpy as np
    from lerobot.datasets import LeRobotDataset

    features = {
        "observation.state": {"dtype": "float32", "shape": (STATE_DIM,), "names": None},
        "action": {"dtype": "float32", "shape": (ACTION_DIM,), "names": None},
        "next.reward": {"dtype": "float32", "shape": (1,), "names": None},
        "next.done": {"dtype": "bool", "shape": (1,), "names": None},
    }
    ds = LeRobotDataset.create(DEMO_REPO, ENV_FPS, features=features, root=root, use_videos=False)
    env = gym.make(
        "gym_hil/PandaPickCube-v0", image_obs=False, use_gripper=True, gripper_penalty=0.0
    )
    rng = np.random.default_rng(seed)
    try:
        for ep in range(episodes):
            obs, _ = env.reset(seed=seed + ep)
            phase = [0, 0]
            for _ in range(ENV_FPS * 10):
                action = _expert_action(obs, phase, rng, noise)
                nxt, reward, terminated, truncated, _ = env.step(action)
                done = bool(terminated or truncated)
                ds.add_frame(
                    {
                        "observation.state": np.asarray(obs["agent_pos"], np.float32),
                        "action": action,
                        "next.reward": np.array([reward], np.float32),
                        "next.done": np.array([done]),
                        "task": DEMO_TASK,
                    }
                )
                obs = nxt
                if done:
                    break
            ds.save_episode()
    finally:
        env.close()
    ds.finalize()
    return root


@dataclass(frozen=True)
class Setup:
    """The comparison's knobs: each side's wall-clock ``minutes``; ``episode_s`` the actor's
    episode limit (LeRobot's ``control_time_s``; the scripted pick needs about 2 s);
    ``learning_starts`` online transitions before the first update (LeRobot's
    ``online_step_before_learning``, robofleet's ``buffer.min_size``); ``demo_episodes``
    scripted demonstrations both sides mount; ``bucket_s`` the success curve's bucket."""

    minutes: float = 5.0
    episode_s: float = 3.0
    learning_starts: int = 100
    demo_episodes: int = 20
    bucket_s: float = 60.0


def lerobot_config(
    out: Path, port: int, demos: Path, setup: Setup, *, for_learner: bool = False
) -> dict[str, Any]:
    """LeRobot's ``TrainRLServerPipelineConfig`` JSON of both sides: gym-hil's pick-cube
    through LeRobot's ``gym_manipulator`` env (no viewer, no teleoperator, no gripper
    penalty), the :data:`POLICY` Gaussian actor (state only), SAC at batch
    :data:`BATCH_SIZE`, the learner (LeRobot's, or the gateway standing in for it) at
    ``127.0.0.1:port``; the offline data LeRobot's learner mixes in: ``demos``
    (:func:`demonstrations`). ``for_learner``: without the env's ``reset`` section (the
    episode length, which only the actor reads): LeRobot's learner logs its config at start
    and draccus cannot encode ``ResetConfig``'s ``Any``-typed field, so it would not start."""
    import draccus

    from cloud_learner.policies.lerobot_gaussian import gaussian_actor_config

    cfg = gaussian_actor_config(STATE_DIM, ACTION_DIM, [], (0, 0), **POLICY)
    policy = json.loads(json.dumps(draccus.encode(cfg)))
    policy.update(
        type="gaussian_actor",
        device="cpu",
        online_steps=1_000_000,
        online_step_before_learning=setup.learning_starts,
        push_to_hub=False,
        concurrency={"actor": "threads", "learner": "threads"},
        actor_learner_config={
            "learner_host": "127.0.0.1",
            "learner_port": port,
            "policy_parameters_push_frequency": PUSH_EVERY_S,
        },
    )
    env = {
        "type": "gym_manipulator",
        "name": "gym_hil",
        "task": "PandaPickCube-v0",
        "fps": ENV_FPS,
        "features": {"action": {"type": "ACTION", "shape": [ACTION_DIM]}},
        "features_map": {"action": "action"},
        "processor": {
            "gripper": {"use_gripper": True, "gripper_penalty": 0.0},
            "reset": {"control_time_s": setup.episode_s, "reset_time_s": 0.0},
        },
    }
    if for_learner:
        del env["processor"]["reset"]  # type: ignore[attr-defined]
    return {
        "output_dir": str(out),
        "job_name": out.name,
        "seed": 1,
        "batch_size": BATCH_SIZE,
        "save_checkpoint": False,
        "log_freq": 1_000_000,
        "dataset": {"repo_id": DEMO_REPO, "root": str(demos)},
        # The critics as wide as the actor, as robofleet's lerobot-sac builds them.
        "algorithm": {
            "type": "sac",
            "critic_network_kwargs": {"hidden_dims": list(POLICY["hidden_sizes"])},
        },
        "env": env,
        "policy": policy,
    }


def run_spec(setup: Setup, demos: Path) -> dict[str, Any]:
    """robofleet's ``lerobot-sac`` run of the same policy and SAC knobs as
    :func:`lerobot_config`, ``demos`` its offline data (the run stops by itself
    ``setup.minutes`` + 5 after it starts; the bench stops it at the budget)."""
    return {
        "version": 1,
        "name": "bench-lerobot-learning",
        "algorithm": "lerobot-sac",
        "tasks": ["pick-cube"],
        "robots": {"robot_type": "lerobot-actor", "count": 1},
        "policy": POLICY,
        # LeRobot's learner: no update cap, no behaviour cloning, lr 3e-4 (its SAC defaults).
        "hyperparameters": {
            "batch_size": BATCH_SIZE,
            "bc_updates": 0,
            "updates_per_s": 0,
            "lr": 3e-4,
        },
        "buffer": {
            "min_size": setup.learning_starts,
            "online_fraction": 0.5,  # LeRobot's online_ratio
            "offline_data": [{"source": str(demos), "format": "lerobot", "task": DEMO_TASK}],
        },
        "learner": {"num_cpus": 0.5},
        "publish": {"every_updates": None, "every_seconds": PUSH_EVERY_S},
        "evaluation": {"on": "none"},
        "stop": {"minutes": setup.minutes + 5},
    }


class _Proc:
    """A child process whose output lines are kept with the seconds since ``t0`` they came;
    :meth:`stop` gives it ``grace_s`` after SIGTERM."""

    def __init__(
        self, argv: list[str], log: Path, env: dict[str, str], t0: float, grace_s: float = 10.0
    ) -> None:
        self.grace_s = grace_s
        self.log = log.open("w")
        self.lines: list[tuple[float, str]] = []
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        self._t0 = t0
        self._reader = threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True)
        self._reader.start()

    def _read(self, out: IO[str]) -> None:
        for line in out:
            self.lines.append((time.monotonic() - self._t0, line.rstrip("\n")))
            self.log.write(line)
        self.log.flush()

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM to its process group, SIGKILL after ``grace_s``."""
        for sig, wait in ((signal.SIGTERM, self.grace_s), (signal.SIGKILL, 10.0)):
            if self.proc.poll() is not None:
                break
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(wait)
            except subprocess.TimeoutExpired:
                continue
        self._reader.join(10)
        self.log.close()


@dataclass
class SideResult:
    """One side's figures: ``episodes`` as (seconds since the actor started, reward),
    ``updates`` (learner updates in the budget), ``loaded`` (versions the actor loaded),
    ``transitions`` (the actor's steps), ``minutes`` (the budget)."""

    name: str
    minutes: float
    episodes: list[tuple[float, float]] = field(default_factory=list)
    updates: int = 0
    loaded: int = 0
    transitions: int = 0

    def successes(self) -> int:
        return sum(1 for _, r in self.episodes if r >= SUCCESS_REWARD)

    def curve(self, bucket_s: float) -> list[tuple[float, int, float | None]]:
        """(bucket end s, episodes ended in it, success rate in it or None) per bucket."""
        out: list[tuple[float, int, float | None]] = []
        end = self.minutes * 60
        edge = bucket_s
        while edge <= end + 1e-9:
            got = [r for t, r in self.episodes if edge - bucket_s <= t < edge]
            rate = sum(1 for r in got if r >= SUCCESS_REWARD) / len(got) if got else None
            out.append((edge, len(got), rate))
            edge += bucket_s
        return out

    def as_json(self, bucket_s: float) -> dict[str, Any]:
        return {
            "episodes": len(self.episodes),
            "successes": self.successes(),
            "success_rate": self.successes() / len(self.episodes) if self.episodes else None,
            "updates": self.updates,
            "versions_loaded": self.loaded,
            "transitions": self.transitions,
            "curve": [
                {"t_s": t, "episodes": n, "success": rate} for t, n, rate in self.curve(bucket_s)
            ],
        }


def _actor_figures(result: SideResult, actor: _Proc, budget_s: float) -> None:
    for t, line in actor.lines:
        if t > budget_s:
            break
        m = EPISODE.search(line)
        if m:
            result.episodes.append((t, float(m.group(2))))
            result.transitions = int(m.group(1)) + 1
        elif LOADED in line:
            result.loaded += 1


def _env(data_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        MUJOCO_GL=env.get("MUJOCO_GL", "egl"),
        HF_HUB_OFFLINE="1",
        ROBOFLEET_DATA_DIR=str(data_dir),
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
        PYTHONUNBUFFERED="1",
    )
    env.pop("ROBOFLEET_CONFIG", None)
    return env


def _wait(cond: Any, what: str, timeout_s: float, procs: list[_Proc]) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        for p in procs:
            if not p.alive():
                raise RuntimeError(f"bench lerobot: {what}: a process ended:\n{p.text()[-3000:]}")
        if time.monotonic() > end:
            raise RuntimeError(f"bench lerobot: timed out waiting for {what}")
        time.sleep(0.2)


def _configs(root: Path, demos: Path, setup: Setup) -> tuple[Path, Path]:
    """(learner's, actor's) config files: one config, two output directories (LeRobot
    refuses to start in an output directory that exists)."""
    port = _free_port()
    out = []
    for who in ("learner", "actor"):
        path = root / f"{who}.json"
        cfg = lerobot_config(root / f"{who}-out", port, demos, setup, for_learner=who == "learner")
        path.write_text(json.dumps(cfg))
        out.append(path)
    return out[0], out[1]


def _actor(config: Path, root: Path, t0: float) -> _Proc:
    argv = [sys.executable, "-m", "lerobot.rl.actor", f"--config_path={config}"]
    return _Proc(argv, root / "actor.log", _env(root), t0)


def lerobot_side(setup: Setup, root: Path, demos: Path) -> SideResult:
    """LeRobot's learner and actor for ``setup.minutes`` (module docstring).

    Raises:
        RuntimeError: a process ended early or did not start (its output in the message).
    """
    root.mkdir(parents=True, exist_ok=True)
    config, actor_config = _configs(root, demos, setup)
    t_learner = time.monotonic()
    learner = _Proc(
        [sys.executable, "-m", "lerobot.rl.learner", f"--config_path={config}"],
        root / "learner.log",
        _env(root),
        t_learner,
    )
    procs = [learner]
    try:
        _wait(lambda: "gRPC server started" in learner.text(), "LeRobot's learner", 300, procs)
        t0 = time.monotonic()
        actor = _actor(actor_config, root, t0)
        procs.append(actor)
        budget = setup.minutes * 60
        _wait(lambda: time.monotonic() - t0 >= budget, "the budget", budget + 60, procs)
        result = SideResult("LeRobot learner", setup.minutes)
        _actor_figures(result, actor, budget)
        until = budget + t0 - t_learner
        result.updates = sum(
            1 for t, line in learner.lines if LEROBOT_UPDATE in line and t <= until
        )
        return result
    finally:
        for p in reversed(procs):
            p.stop()


def robofleet_side(setup: Setup, root: Path, demos: Path) -> SideResult:
    """A fresh robofleet cloud with a ``lerobot-sac`` run, a gateway and the actor for
    ``setup.minutes`` (module docstring).

    Raises:
        RuntimeError: a process ended early or did not start (its output in the message).
    """
    from foundation.runspec import parse_run_spec
    from robofleet.cloud import CloudService
    from robofleet.settings import load_settings

    root.mkdir(parents=True, exist_ok=True)
    config, actor_config = _configs(root, demos, setup)
    settings = load_settings(None, data_dir=root / "cloud")
    cloud = CloudService(settings, dashboard_port=None, grpc_port=0, auto_resume=False)
    procs: list[_Proc] = []
    try:
        cloud.start()
        assert cloud.manager is not None and cloud.store is not None
        address = f"127.0.0.1:{cloud.server.port}"
        token = cloud.store.create_enrollment_token(timedelta(minutes=30))
        argv = [
            *(sys.executable, "-m", "robofleet.cli", "lerobot-gateway"),
            *("--server", address, "--robot", "panda-bench", "--token", token),
            *("--lerobot-config", str(config), "--spool-dir", str(root / "gateway")),
        ]
        # The gateway drains its spool to the cloud when stopped.
        gateway = _Proc(argv, root / "gateway.log", _env(root / "cloud"), time.monotonic(), 30.0)
        procs.append(gateway)
        _wait(lambda: "ready on port" in gateway.text(), "the gateway", 300, procs)
        spec = parse_run_spec(run_spec(setup, demos))
        run_id = cloud.manager.launch(spec, actor="bench-lerobot")
        driver = cloud.manager.drivers[run_id]
        _wait(lambda: driver.progress.get("state") == "running", "the run to start", 300, procs)
        t0 = time.monotonic()
        actor = _actor(actor_config, root, t0)
        procs.append(actor)
        budget = setup.minutes * 60
        _wait(lambda: time.monotonic() - t0 >= budget, "the budget", budget + 60, procs)
        updates = int(driver.progress.get("learner_step", 0))
        cloud.manager.stop(run_id, actor="bench-lerobot")
        result = SideResult("robofleet", setup.minutes)
        _actor_figures(result, actor, budget)
        result.updates = updates
        return result
    finally:
        for p in reversed(procs):
            p.stop()
        cloud.close()


def learning(setup: Setup, root: Path) -> dict[str, Any]:
    """Both sides, LeRobot's first, on the same demonstrations; prints their table; their
    figures (JSON-able)."""
    demos = demonstrations(root / "demos", setup.demo_episodes)
    theirs = lerobot_side(setup, root / "lerobot", demos)
    ours = robofleet_side(setup, root / "robofleet", demos)
    b = setup.bucket_s
    print(
        f"\nLearning: one LeRobot actor in gym-hil PandaPickCube-v0 (sparse reward, no operator,"
        f" {setup.episode_s:g} s episodes), {setup.demo_episodes} scripted demonstrations"
        f" mounted on both sides, {setup.minutes:g} min each side; success = episode reward"
        f" >= {SUCCESS_REWARD:g}, by {b:g} s of the budget"
    )
    print(
        f"{'side':<18}{'episodes':>9}{'success':>9}{'updates':>9}{'versions':>9}{'steps':>8}"
        + "".join(f"{f'<{t:.0f}s':>8}" for t, _, _ in ours.curve(b))
    )
    for side in (ours, theirs):
        rate = side.successes() / len(side.episodes) if side.episodes else float("nan")
        cells = "".join(f"{'-' if r is None else f'{r:.2f}':>8}" for _, _, r in side.curve(b))
        print(
            f"{side.name:<18}{len(side.episodes):>9}{rate:>9.2f}{side.updates:>9}"
            f"{side.loaded:>9}{side.transitions:>8}{cells}"
        )
    return {
        "minutes": setup.minutes,
        "episode_s": setup.episode_s,
        "learning_starts": setup.learning_starts,
        "demo_episodes": setup.demo_episodes,
        "bucket_s": b,
        "ours": ours.as_json(b),
        "lerobot": theirs.as_json(b),
    }
