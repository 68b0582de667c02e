"""Any Gymnasium environment id as a fleet robot (gym-hil's Panda tasks, classic control, ...).

Observation mapping (LeRobot names): a flat ``Box`` becomes ``observation.state``; a ``Dict``
maps ``agent_pos`` to ``observation.state``, ``pixels`` (an image or a dict of images) to
``observation.images.<name>``, an ``(H, W, C)`` uint8 ``Box`` to an image, and any other
vector key ``k`` to ``observation.<k>``. Actions must be a 1-D ``Box``; its finite bounds are the
safety clip. Episode success is ``info['is_success']`` or ``info['success']``.

An id's namespace names the package that registers it (``gym_hil`` of
``gym_hil/PandaPickCubeBase-v0``); the driver imports that package before ``gymnasium.make``,
which by itself imports only the ``module:`` of ``module:namespace/Name-vN``.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from hal.driver import Applied, Observation, RobotDriver
from hal.spec import CameraSpec, Capabilities, Feature, RobotSpec


def _is_image(space: Any) -> bool:
    return len(space.shape) == 3 and space.dtype == np.uint8 and space.shape[2] in (1, 3, 4)


def import_env_namespace(env_id: str) -> None:
    """Import the package named by ``env_id``'s namespace when no env of that namespace is
    registered yet (``gym_hil`` for ``gym_hil/PandaPickCubeBase-v0``): such packages register
    their envs when imported. Nothing happens for an id without a namespace, a ``module:`` id
    (``gymnasium.make`` imports that module) or a namespace that is no importable package
    (``gymnasium.make`` then names it as not found).

    Raises:
        ValueError: the namespace's package exists but fails to import (e.g. its simulator is
            missing), naming both.
        gymnasium.error.Error: ``env_id`` is malformed.
    """
    import gymnasium as gym
    from gymnasium.envs.registration import parse_env_id

    if ":" in env_id:
        return
    namespace, _name, _version = parse_env_id(env_id)
    if namespace is None or not namespace.isidentifier():
        return
    if any(spec.namespace == namespace for spec in gym.registry.values()):
        return
    if importlib.util.find_spec(namespace) is None:
        return
    try:
        importlib.import_module(namespace)
    except ImportError as exc:
        raise ValueError(f"importing {namespace!r}, the package of its namespace: {exc}") from None


class GymnasiumDriver(RobotDriver):
    """Wrap ``gymnasium.make(env_id, **env_kwargs)``.

    Args:
        name: robot name.
        env_id: Gymnasium id, e.g. ``Pendulum-v1`` or ``gym_hil/PandaPickCubeBase-v0`` (its
            namespace's package is imported first, see the module doc).
        env_kwargs: keyword arguments of ``gymnasium.make``.
        robot_type: scheduling type (default: the env id, lower-cased, ``/`` -> ``-``).
        max_episode_steps: truncation limit (default: the env's registered TimeLimit).
        control_hz: control rate (default: ``metadata['render_fps']``, else 10 Hz).
        seed: seed of the first reset without one (each further reset increments it).

    Raises:
        ValueError: the id is unknown, its namespace's package fails to import, or its action
            space is not a 1-D Box.
    """

    def __init__(
        self,
        name: str,
        env_id: str,
        env_kwargs: Mapping[str, Any] | None = None,
        robot_type: str | None = None,
        max_episode_steps: int | None = None,
        control_hz: float | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(name)
        import gymnasium as gym
        from gymnasium import spaces

        self._env_id = env_id
        self._env_kwargs = dict(env_kwargs or {})
        try:
            import_env_namespace(env_id)
            self._env: Any = gym.make(env_id, **self._env_kwargs)
        except (gym.error.Error, ValueError) as exc:
            raise ValueError(f"robot {name}: cannot make Gymnasium env {env_id!r}: {exc}") from None
        act = self._env.action_space
        if not isinstance(act, spaces.Box) or len(act.shape) != 1:
            self._env.close()
            raise ValueError(
                f"robot {name}: env {env_id!r} has action space {act}; only a 1-D Box is supported"
            )
        self._keys: list[tuple[tuple[str, ...], str]] = []  # (path in the gym obs, feature key)
        features: dict[str, Feature] = {}
        cams: list[CameraSpec] = []
        self._map_space(self._env.observation_space, (), features, cams)
        low = [float(x) if np.isfinite(x) else -1e30 for x in act.low]
        high = [float(x) if np.isfinite(x) else 1e30 for x in act.high]
        limit = max_episode_steps or (self._env.spec.max_episode_steps if self._env.spec else None)
        hz = control_hz or float(self._env.metadata.get("render_fps") or 10.0)
        self.spec = RobotSpec(
            robot_type=robot_type or env_id.lower().replace("/", "-").replace(":", "-"),
            observation_features=features,
            action_features={
                "action": Feature(
                    dtype="float32", shape=act.shape, names=[f"a{i}" for i in range(act.shape[0])]
                )
            },
            control_hz=hz,
            cameras=cams,
            capabilities=Capabilities(can_reset=True, simulated=True, reward="dense"),
            action_low=low,
            action_high=high,
            max_episode_steps=limit,
        )
        self._next_seed = seed
        self._obs: Any = None

    def _map_space(
        self,
        space: Any,
        path: tuple[str, ...],
        features: dict[str, Feature],
        cams: list[CameraSpec],
    ) -> None:
        from gymnasium import spaces

        if isinstance(space, spaces.Dict):
            for key, sub in space.spaces.items():
                self._map_space(sub, (*path, key), features, cams)
            return
        if not isinstance(space, spaces.Box):
            raise ValueError(
                f"robot {self.name}: observation {'/'.join(path)} is {space}; need Box"
            )
        if _is_image(space):
            cam = path[-1] if path and path[-1] != "pixels" else "pixels"
            h, w, c = space.shape
            cams.append(CameraSpec(name=cam, height=h, width=w, channels=c))
            key = f"observation.images.{cam}"
            features[key] = Feature(
                dtype="video", shape=space.shape, names=["height", "width", "channels"]
            )
        else:
            leaf = path[-1] if path else "state"
            key = "observation.state" if leaf in ("state", "agent_pos") else f"observation.{leaf}"
            n = int(np.prod(space.shape))
            features[key] = Feature(
                dtype="float32", shape=(n,), names=[f"{leaf}_{i}" for i in range(n)]
            )
        self._keys.append((path, key))

    def _convert(self, raw: Any) -> Observation:
        out: Observation = {}
        for path, key in self._keys:
            value = raw
            for p in path:
                value = value[p]
            arr = np.asarray(value)
            out[key] = (
                arr.astype(np.uint8)
                if key.startswith("observation.images.")
                else arr.astype(np.float32).reshape(-1)
            )
        return out

    def _connect(self) -> None:
        if self._env is None:
            import gymnasium as gym

            self._env = gym.make(self._env_id, **self._env_kwargs)
        self._reset("", None)

    def _disconnect(self) -> None:
        self._env.close()
        self._env = None

    def _reset(self, task: str, seed: int | None) -> Observation:
        if seed is None:
            seed = self._next_seed
            self._next_seed += 1
        self._obs, _info = self._env.reset(seed=seed)
        return self._convert(self._obs)

    def _get_observation(self) -> Observation:
        return self._convert(self._obs)

    def _apply_action(self, action: NDArray[np.float32]) -> Applied:
        self._obs, reward, terminated, truncated, info = self._env.step(action)
        success = bool(info.get("is_success", info.get("success", False)))
        return Applied(action, float(reward), bool(terminated), bool(truncated), success)
