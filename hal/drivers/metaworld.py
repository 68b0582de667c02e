"""Meta-World v3 (MuJoCo Sawyer) as a fleet robot, plus the task's scripted expert.

Goal-observable state observations (39 floats, layout from Meta-World's ``SawyerXYZEnv``:
hand xyz, gripper opening, two object poses (xyz + wxyz quaternion), the same 18 values one
frame earlier, then the goal xyz). Actions are 4 floats in [-1, 1]: end-effector deltas and
the gripper effort. Each episode's goal comes from Meta-World's MT1 task list (50 goal
variations per task, generated with ``benchmark_seed``); ``reset(seed=s)`` picks variation
``s % 50`` and seeds the simulator, so an evaluation configuration (task, seed) is repeatable.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from hal.driver import EPISODE_OPTIONS, Applied, DriverError, Expert, Observation, RobotDriver
from hal.drivers.rendering import choose_gl_backend
from hal.spec import CameraSpec, Capabilities, Feature, RobotSpec

# MuJoCo reads MUJOCO_GL once, at its import: choose before anything imports it.
choose_gl_backend()

ROBOT_TYPE = "metaworld-sawyer"
DEFAULT_MAX_EPISODE_STEPS = 500  # Meta-World's max_path_length
CONTROL_HZ = 80.0  # frame_skip 5 x timestep 2.5 ms
_OBJ = [f"{o}_{c}" for o in ("obj1", "obj2") for c in ("x", "y", "z", "qw", "qx", "qy", "qz")]
_FRAME = ["hand_x", "hand_y", "hand_z", "gripper_distance", *_OBJ]
STATE_NAMES = [*_FRAME, *(f"prev_{n}" for n in _FRAME), "goal_x", "goal_y", "goal_z"]
ACTION_NAMES = ["delta_x", "delta_y", "delta_z", "gripper"]


def v3_tasks() -> list[str]:
    """Names of every Meta-World v3 task (``reach-v3``, ``pick-place-v3``, ...)."""
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS

    return list(ALL_V3_ENVIRONMENTS)


def expert_policy(task: str) -> Expert:
    """Meta-World's scripted expert for ``task`` (``metaworld.policies``) as ``obs -> action``.

    The callable takes a driver observation dict (uses ``observation.state``) or the raw
    (39,) state, and returns a float32 action of shape (4,) in [-1, 1]. Used as the simulated
    operator for HG-DAgger.

    Raises:
        ValueError: ``task`` has no scripted expert.
    """
    from metaworld.policies import ENV_POLICY_MAP

    if task not in ENV_POLICY_MAP:
        raise ValueError(f"no scripted expert for task {task!r}; known: {sorted(ENV_POLICY_MAP)}")
    policy: Any = ENV_POLICY_MAP[task]()  # type: ignore[abstract]

    def act(obs: Mapping[str, Any] | NDArray[Any]) -> NDArray[np.float32]:
        state = obs["observation.state"] if isinstance(obs, Mapping) else obs
        action = policy.get_action(np.asarray(state, dtype=np.float64))
        return np.clip(np.asarray(action, dtype=np.float32), -1.0, 1.0)

    return act


MT1_LOCK = threading.RLock()
"""Held while Meta-World builds a goal-variation list.

``metaworld.MT1(task, seed=s)`` seeds numpy's *global* random state, draws 50 goals with
``np.random.uniform`` and restores the state; it takes no local ``RandomState``. Two builds at
once interleave their draws and fail ("Only generated 49 unique goals") or yield another list.
Every build in this module holds this lock; code of yours that builds ``metaworld.MT1`` /
``ML1`` in threads should hold it too (reentrant, so it may wrap ``driver.connect()``).
Draws from ``np.random`` by unrelated threads during a build are outside its reach.
"""


@dataclass(frozen=True)
class GroundTruth:
    """The simulator's own verdict on the last step, kept aside when the driver hides it
    from robofleet: for measurement and for simulated people (who see the scene), never
    for learning. ``reward`` is Meta-World's dense shaped reward (float, 0-10); ``success``
    its ``info['success']``; ``first_success_frame`` the episode's first successful step
    (0-based, None before it)."""

    task: str
    seed: int | None
    frame: int
    reward: float
    success: bool
    first_success_frame: int | None


@functools.lru_cache(maxsize=64)
def _build_mt1(task: str, benchmark_seed: int) -> Any:
    import metaworld

    return metaworld.MT1(task, seed=benchmark_seed)


def _mt1(task: str, benchmark_seed: int) -> Any:
    """The cached ``metaworld.MT1`` benchmark of ``task``; thread-safe (see ``MT1_LOCK``)."""
    with MT1_LOCK:  # the cache lookup too: two misses at once would build concurrently
        return _build_mt1(task, benchmark_seed)


class MetaWorldDriver(RobotDriver):
    """One simulated Sawyer that can run any v3 task, switching per episode.

    Args:
        name: robot name.
        task: the task of the first episode (default: first of ``tasks``).
        tasks: tasks this robot may run (default: ``[task]``); ``reset(task=...)`` switches.
            ``connect`` builds the scene of every one of them.
        max_episode_steps: truncation limit (default 500, Meta-World's).
        cameras: camera names of the Meta-World scene to render (``corner``, ``topview``,
            ``behindGripper``, ``gripperPOV``, ...); empty for state only.
        image_size: (height, width) of rendered images.
        render_effects: render shadows, reflections and the skybox. Off by default: with
            software GL (EGL/OSMesa on a machine without a GPU) they cost about 10x the frame
            (200 vs 20 ms for 64x64 on a 2-core machine), too slow for 20 Hz control.
        benchmark_seed: seed of the goal-variation list (fix it for evaluation).
        seed: default seed of episodes reset without one (each such reset increments it).
        terminate_on_success: end the episode (terminated=True) at success.
        robot_type: scheduling type (default ``metaworld-sawyer``).
        reward: the reward robofleet sees: ``dense`` (Meta-World's shaped reward), ``sparse``
            (1.0 on each step the task is solved, else 0.0) or ``none`` (0.0, as an arm
            reports): ``capabilities.reward``.
        detects_success: report ``success`` to robofleet (False: never, as an arm without
            a success detector): ``capabilities.detects_success``.
        self_reset: the robot resets itself between episodes (False: ``capabilities.can_reset``
            is False, so the edge agent waits for a person's "ready" before each reset; the
            reset then models the scene the person put back).
        ground_truth_log: a JSON-lines file that receives one line per ended episode with
            the simulator's hidden verdict (:class:`GroundTruth`), for measurement only.

    A robot with ``reward="none", detects_success=False, self_reset=False`` gives robofleet
    what a real arm gives; :attr:`ground_truth` keeps the simulator's verdict aside.

    Raises:
        ValueError: unknown task or bad option.

    It offers each task's scripted expert (``hal.driver.ScriptedExpertDriver``) and lists
    every v3 task (``hal.driver.TaskCatalogDriver``).
    """

    episode_options = EPISODE_OPTIONS

    def __init__(
        self,
        name: str,
        task: str | None = None,
        tasks: Sequence[str] | None = None,
        max_episode_steps: int = DEFAULT_MAX_EPISODE_STEPS,
        cameras: Sequence[str] = (),
        image_size: tuple[int, int] = (96, 96),
        render_effects: bool = False,
        benchmark_seed: int = 0,
        seed: int = 0,
        terminate_on_success: bool = False,
        robot_type: str = ROBOT_TYPE,
        reward: Literal["dense", "sparse", "none"] = "dense",
        detects_success: bool = True,
        self_reset: bool = True,
        ground_truth_log: str | Path | None = None,
    ) -> None:
        super().__init__(name)
        if reward not in ("dense", "sparse", "none"):
            raise ValueError(f"reward must be dense, sparse or none, got {reward!r}")
        known = v3_tasks()
        task_list = list(tasks) if tasks else ([task] if task else ["reach-v3"])
        bad = [t for t in task_list if t not in known]
        if bad:
            raise ValueError(f"unknown Meta-World v3 task(s) {bad}; known: {known}")
        if task is not None and task not in task_list:
            raise ValueError(f"task {task!r} is not in tasks {task_list}")
        if max_episode_steps <= 0:
            raise ValueError(f"max_episode_steps must be positive, got {max_episode_steps}")
        h, w = image_size
        obs_features = {
            "observation.state": Feature(dtype="float32", shape=(39,), names=STATE_NAMES),
        }
        cams = [CameraSpec(name=c, height=h, width=w) for c in cameras]
        for cam in cams:
            obs_features[f"observation.images.{cam.name}"] = Feature(
                dtype="video", shape=(h, w, 3), names=["height", "width", "channels"]
            )
        self.spec = RobotSpec(
            robot_type=robot_type,
            observation_features=obs_features,
            action_features={
                "action": Feature(dtype="float32", shape=(4,), names=ACTION_NAMES),
            },
            control_hz=CONTROL_HZ,
            cameras=cams,
            capabilities=Capabilities(
                can_reset=bool(self_reset),
                simulated=True,
                multi_task=True,
                reward=reward,
                detects_success=bool(detects_success),
            ),
            action_low=[-1.0] * 4,
            action_high=[1.0] * 4,
            max_episode_steps=max_episode_steps,
            tasks=task_list,
        )
        self._first_task = task or task_list[0]
        self._benchmark_seed = benchmark_seed
        self._next_seed = seed
        self._terminate_on_success = terminate_on_success
        self._envs: dict[str, Any] = {}
        self._env: Any = None
        self._state: NDArray[np.float32] | None = None
        self._renderer: Any = None
        self._render_effects = render_effects
        self._gt_log = None if ground_truth_log is None else Path(ground_truth_log)
        self.ground_truth: GroundTruth | None = None

    def expert(self, task: str) -> Expert:
        """Meta-World's scripted expert of ``task`` (:func:`expert_policy`)."""
        return expert_policy(task)

    def available_tasks(self) -> list[str]:
        """Every Meta-World v3 task (:func:`v3_tasks`)."""
        return v3_tasks()

    # -- hooks -------------------------------------------------------------------------------

    def _connect(self) -> None:
        if self.spec.cameras:
            if choose_gl_backend() is None:
                raise DriverError(
                    f"robot {self.name}: cameras need MuJoCo rendering but neither EGL nor "
                    "OSMesa is installed (set MUJOCO_GL or drop cameras)"
                )
        # Every task's scene is built now, not at the first reset into it: MT1's goal list plus
        # the MuJoCo model (2.8 s of CPU for the demo's four tasks on an idle core, Meta-World's
        # import included) would otherwise stall the robot's first episode of each task inside
        # a run; a real cell is set up before its run.
        for task in self.spec.tasks:
            self._env_for(task)
        self._env = self._env_for(self._first_task)
        import mujoco

        for cam in self.spec.cameras:
            if mujoco.mj_name2id(self._env.model, mujoco.mjtObj.mjOBJ_CAMERA, cam.name) < 0:
                raise DriverError(
                    f"robot {self.name}: the Meta-World scene has no camera {cam.name!r}"
                )
        self._reset(self._first_task, None)

    def _disconnect(self) -> None:
        self._log_ground_truth()
        self.ground_truth = None
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
        for env in self._envs.values():
            env.close()
        self._envs.clear()
        self._env = None

    def _reset(self, task: str, seed: int | None) -> Observation:
        self._log_ground_truth()
        if seed is None:
            seed = self._next_seed
            self._next_seed += 1
        env = self._env_for(task)
        if env is not self._env and self._renderer is not None:
            self._renderer.close()
            self._renderer = None
        self._env = env
        variations = _mt1(task, self._benchmark_seed).train_tasks
        env.set_task(variations[seed % len(variations)])
        state, _info = env.reset(seed=seed)
        self._state = np.asarray(state, dtype=np.float32)
        self.ground_truth = GroundTruth(task, seed, 0, 0.0, False, None)
        return self._get_observation()

    def _get_observation(self) -> Observation:
        assert self._state is not None
        obs: Observation = {"observation.state": self._state.copy()}
        for cam in self.spec.cameras:
            obs[f"observation.images.{cam.name}"] = self._render(cam)
        return obs

    def _apply_action(self, action: NDArray[np.float32]) -> Applied:
        state, reward, terminated, truncated, info = self._env.step(action)
        self._state = np.asarray(state, dtype=np.float32)
        success = bool(info.get("success", 0.0))
        self._witness(float(reward), success)
        caps = self.spec.capabilities
        seen = {"dense": float(reward), "sparse": float(success), "none": 0.0}[caps.reward]
        return Applied(
            sent=action,
            reward=seen,
            # A success it does not report must not leak through an early termination.
            terminated=bool(terminated)
            or (self._terminate_on_success and success and caps.detects_success),
            truncated=bool(truncated),
            success=success and caps.detects_success,
        )

    def _witness(self, reward: float, success: bool) -> None:
        """Keep the simulator's verdict of the step just taken aside (:class:`GroundTruth`)."""
        gt = self.ground_truth
        if gt is None:
            return
        first = gt.first_success_frame
        if first is None and success:
            first = gt.frame
        self.ground_truth = GroundTruth(gt.task, gt.seed, gt.frame + 1, reward, success, first)

    def _log_ground_truth(self) -> None:
        """Append the ended episode's hidden verdict to ``ground_truth_log`` (if any)."""
        gt = self.ground_truth
        if self._gt_log is None or gt is None or gt.frame == 0:
            return
        self._gt_log.parent.mkdir(parents=True, exist_ok=True)
        with self._gt_log.open("a") as f:
            f.write(json.dumps({"robot": self.name, **asdict(gt)}) + "\n")

    # -- internals ---------------------------------------------------------------------------

    def _env_for(self, task: str) -> Any:
        env = self._envs.get(task)
        if env is None:
            env = _mt1(task, self._benchmark_seed).train_classes[task]()
            env.max_path_length = self.spec.max_episode_steps
            self._envs[task] = env
        return env

    def _render(self, cam: CameraSpec) -> NDArray[np.uint8]:
        import mujoco

        if self._renderer is None:
            try:
                self._renderer = mujoco.Renderer(self._env.model, cam.height, cam.width)
            except Exception as exc:  # the GL stack reports many error types
                raise DriverError(
                    f"robot {self.name}: MuJoCo rendering failed with "
                    f"MUJOCO_GL={choose_gl_backend()}: {exc}"
                ) from exc
            if not self._render_effects:
                flags = self._renderer.scene.flags
                for flag in (
                    mujoco.mjtRndFlag.mjRND_SHADOW,
                    mujoco.mjtRndFlag.mjRND_REFLECTION,
                    mujoco.mjtRndFlag.mjRND_SKYBOX,
                ):
                    flags[flag] = False
        try:
            self._renderer.update_scene(self._env.data, camera=cam.name)
        except (ValueError, KeyError) as exc:
            raise DriverError(f"robot {self.name}: no camera {cam.name!r} in the scene") from exc
        return np.asarray(self._renderer.render(), dtype=np.uint8).copy()
