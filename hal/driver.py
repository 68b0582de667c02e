"""The driver contract every robot satisfies, shaped like LeRobot's ``Robot``.

The loop an edge agent runs against any driver::

    driver.connect()
    obs = driver.reset(task="reach-v3")            # dict[str, np.ndarray], keys = observation_features
    while not (driver.episode.terminated or driver.episode.truncated):
        sent = driver.send_action({"action": policy(obs)})   # what really went out (clipped)
        obs = driver.get_observation()
        driver.episode.reward, driver.episode.success         # what the robot reports
    driver.disconnect()

This base class owns the safety rules, so each driver only moves the robot:
``send_action`` validates the action (shape, finite), clips it to the spec's bounds, refuses
while e-stopped or disconnected, and counts steps (truncating at ``max_episode_steps``).
Drivers implement the ``_connect`` / ``_disconnect`` / ``_get_observation`` / ``_apply_action``
/ ``_reset`` hooks.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike, NDArray

from hal.spec import RobotSpec, validate_name

Observation = dict[str, NDArray[Any]]

# A scripted expert: an observation dict (or its bare ``observation.state``) -> action (A,).
Expert = Callable[[Mapping[str, Any] | NDArray[Any]], NDArray[np.float32]]

EPISODE_OPTIONS = frozenset({"tasks", "max_episode_steps", "seed", "terminate_on_success"})
"""The run-wide episode options a driver kind may take as keyword options (see
``RobotDriver.episode_options``)."""


class DriverError(RuntimeError):
    """Base of driver errors."""


class NotConnectedError(DriverError):
    """The driver is not connected (call ``connect()`` first)."""


class EStopError(DriverError):
    """The robot is e-stopped; it refuses actions until ``clear_estop()``."""


class EpisodeEndedError(DriverError):
    """The episode is terminated or truncated; call ``reset()`` before sending more actions."""


class ActionError(ValueError):
    """An action is malformed (wrong keys, shape, or not finite). Nothing was sent."""


@dataclass
class EpisodeState:
    """The current episode as the robot reports it (Gymnasium's step outputs).

    ``frame_index`` counts actions sent since ``reset``; ``reward`` is the last step's reward
    (0.0 for robots without one); ``success`` follows Meta-World's ``info['success']``.
    """

    task: str = ""
    seed: int | None = None
    frame_index: int = 0
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    success: bool = False

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


@dataclass
class Applied:
    """What a driver's ``_apply_action`` reports: the action really sent and the step outcome."""

    sent: NDArray[np.float32]
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    success: bool = False


class RobotDriver(ABC):
    """A robot behind the fleet's contract. Subclasses set ``spec`` in ``__init__``.

    Args:
        name: unique robot name (the Ray resource ``robot/<name>``), 1-128 of [A-Za-z0-9_.-].
    """

    spec: RobotSpec
    episode_options: ClassVar[frozenset[str]] = frozenset()
    """Which of ``EPISODE_OPTIONS`` this kind takes as keyword options: ``tasks`` (names),
    ``max_episode_steps`` (it ends its own episodes there), ``seed`` (of the first episode)
    and ``terminate_on_success``. Whoever builds a driver passes exactly these
    (``hal.drivers.make_driver``'s ``episode``); the edge agent truncates the episodes of
    a driver without ``max_episode_steps`` itself."""

    def __init__(self, name: str) -> None:
        self.name = validate_name(name)
        self._connected = False
        self._estop = threading.Event()
        self._lock = threading.RLock()
        self.episode = EpisodeState()

    # -- LeRobot-shaped surface ----------------------------------------------------------------

    @property
    def observation_features(self) -> dict[str, dict[str, Any]]:
        """LeRobot feature dict of observations; available before ``connect``."""
        return {k: f.model_dump() for k, f in self.spec.observation_features.items()}

    @property
    def action_features(self) -> dict[str, dict[str, Any]]:
        """LeRobot feature dict of actions (one key, ``action``); available before ``connect``."""
        return {k: f.model_dump() for k, f in self.spec.action_features.items()}

    @property
    def control_hz(self) -> float:
        return self.spec.control_hz

    @property
    def cameras(self) -> list[str]:
        return [c.name for c in self.spec.cameras]

    @property
    def capabilities(self) -> dict[str, bool]:
        return self.spec.capabilities.model_dump()

    @property
    def is_connected(self) -> bool:
        return self._connected

    def connect(self) -> None:
        """Open the connection (idempotent). Raises DriverError when the robot is unreachable."""
        with self._lock:
            if not self._connected:
                self._connect()
                self._connected = True

    def disconnect(self) -> None:
        """Release the robot (idempotent; safe after errors)."""
        with self._lock:
            if self._connected:
                self._connected = False
                self._disconnect()

    def get_observation(self) -> Observation:
        """The current observation: arrays keyed as ``observation_features``.

        Raises:
            NotConnectedError: before ``connect``.
        """
        with self._lock:
            self._require_connected()
            return self._get_observation()

    def send_action(self, action: Mapping[str, ArrayLike] | ArrayLike) -> dict[str, NDArray[Any]]:
        """Send one action; returns ``{"action": float32 array}`` actually sent after clipping.

        Args:
            action: ``{"action": array of shape (action_dim,)}`` or the bare array.

        Raises:
            ActionError: wrong key, shape, dtype or a non-finite value (nothing is sent).
            EStopError: the robot is e-stopped.
            EpisodeEndedError: the episode is over; ``reset()`` first.
            NotConnectedError: before ``connect``.
        """
        vec = self._validate_action(action)
        with self._lock:
            if self._estop.is_set():
                raise EStopError(f"robot {self.name} is e-stopped; clear_estop() to resume")
            self._require_connected()
            if self.episode.done:
                raise EpisodeEndedError(f"robot {self.name}: episode ended; call reset() first")
            if self.spec.action_low is not None or self.spec.action_high is not None:
                lo = -np.inf if self.spec.action_low is None else np.asarray(self.spec.action_low)
                hi = np.inf if self.spec.action_high is None else np.asarray(self.spec.action_high)
                vec = np.clip(vec, lo, hi).astype(np.float32)
            applied = self._apply_action(vec)
            ep = self.episode
            ep.frame_index += 1
            ep.reward = float(applied.reward)
            ep.terminated = bool(applied.terminated)
            ep.success = ep.success or bool(applied.success)
            limit = self.spec.max_episode_steps
            ep.truncated = bool(applied.truncated) or (
                limit is not None and ep.frame_index >= limit
            )
            return {"action": np.asarray(applied.sent, dtype=np.float32)}

    def reset(self, task: str | None = None, seed: int | None = None) -> Observation:
        """Start a new episode (optionally of another ``task``, with ``seed``); returns its first
        observation. Robots without ``can_reset`` wait for a human and return the current state.

        Raises:
            ValueError: ``task`` is not one of ``spec.tasks``.
            EStopError: the robot is e-stopped.
        """
        if task is not None and self.spec.tasks and task not in self.spec.tasks:
            raise ValueError(f"robot {self.name} has no task {task!r}; it runs {self.spec.tasks}")
        with self._lock:
            if self._estop.is_set():
                raise EStopError(f"robot {self.name} is e-stopped; clear_estop() to resume")
            self._require_connected()
            chosen = task or self.episode.task or (self.spec.tasks[0] if self.spec.tasks else "")
            obs = self._reset(chosen, seed)
            self.episode = EpisodeState(task=chosen, seed=seed)
            return obs

    def estop(self) -> None:
        """Emergency stop: latch, stop motion now. Thread-safe; never blocks on the control loop."""
        self._estop.set()
        self._halt()

    def clear_estop(self) -> None:
        """Release the e-stop latch (a human decision)."""
        self._estop.clear()

    @property
    def is_estopped(self) -> bool:
        return self._estop.is_set()

    def is_healthy(self) -> bool:
        """Connected, not e-stopped, and the driver reports no fault."""
        return self._connected and not self._estop.is_set() and self._healthy()

    # -- hooks -----------------------------------------------------------------------------------

    @abstractmethod
    def _connect(self) -> None: ...

    @abstractmethod
    def _disconnect(self) -> None: ...

    @abstractmethod
    def _get_observation(self) -> Observation: ...

    @abstractmethod
    def _apply_action(self, action: NDArray[np.float32]) -> Applied: ...

    @abstractmethod
    def _reset(self, task: str, seed: int | None) -> Observation: ...

    def _halt(self) -> None:
        """Stop motion immediately (called from any thread by ``estop``). Default: nothing moves
        between actions, so refusing further actions is enough."""
        return None

    def _healthy(self) -> bool:
        return True

    # -- helpers ---------------------------------------------------------------------------------

    def _require_connected(self) -> None:
        if not self._connected:
            raise NotConnectedError(f"robot {self.name} is not connected; call connect() first")

    def _validate_action(self, action: Mapping[str, ArrayLike] | ArrayLike) -> NDArray[np.float32]:
        if isinstance(action, Mapping):
            extra = set(action) - {"action"}
            if "action" not in action or extra:
                raise ActionError(
                    f"robot {self.name}: action must have exactly the key 'action', "
                    f"got {sorted(map(str, action))}"
                )
            action = action["action"]
        try:
            vec = np.asarray(action, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise ActionError(f"robot {self.name}: action is not numeric: {exc}") from None
        want = (self.spec.action_dim,)
        if vec.shape != want:
            raise ActionError(f"robot {self.name}: action shape {vec.shape}, expected {want}")
        if not np.all(np.isfinite(vec)):
            raise ActionError(f"robot {self.name}: action has NaN or inf: {vec.tolist()}")
        return vec


@runtime_checkable
class ScriptedExpertDriver(Protocol):
    """A driver that offers a scripted expert per task (a simulator's hand-written controller):
    the operator of a simulated fleet, and what a demonstration drives with."""

    def expert(self, task: str) -> Expert:
        """The expert of ``task``: observation -> float32 action (A,) within the action bounds.

        Raises:
            ValueError: ``task`` has no scripted expert.
        """
        ...


@runtime_checkable
class TaskCatalogDriver(Protocol):
    """A driver that can run any of a known list of tasks (built with ``tasks``, one
    ``reset(task=...)`` away from each): what an idle robot computer describes itself with."""

    def available_tasks(self) -> list[str]:
        """Every task name a driver of this kind can run."""
        ...
