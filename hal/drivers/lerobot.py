"""Any LeRobot robot (so100_follower, koch_follower, ...) behind the fleet's driver contract.

The robot is built from its type name and config with LeRobot's own factory
(``RobotConfig.get_choice_class`` + ``make_robot_from_config``); its per-motor features are
turned into LeRobot dataset features with ``lerobot.utils.feature_utils.hw_to_dataset_features``
(``observation.state`` = the float entries in the robot's order, ``observation.images.<cam>``),
and actions go back out as the robot's ``{motor: value}`` dict. LeRobot's ``send_action`` does
its own safety clipping (``max_relative_target``); what it returns is what we report as sent.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from hal.driver import Applied, DriverError, Observation, RobotDriver
from hal.lerobot_registry import find_choice_class
from hal.spec import CameraSpec, Capabilities, Feature, RobotSpec


def robot_config_class(type_name: str, module: str | None = None) -> Any:
    """LeRobot's ``RobotConfig`` subclass registered as ``type_name``.

    Imports ``module`` first when given (a plugin package), then LeRobot's robot packages and
    third-party ``lerobot_robot_*`` plugins until one registers the name.

    Raises:
        ValueError: no config class is registered under ``type_name``.
    """
    from lerobot.robots import RobotConfig

    if module:
        importlib.import_module(module)

    found = find_choice_class(RobotConfig, "lerobot.robots", type_name)
    if found is None:
        known = sorted(RobotConfig.get_known_choices())
        raise ValueError(f"no LeRobot robot type {type_name!r}; known: {known}")
    return found


def _feature_from_hw(features: dict[str, dict[str, Any]]) -> dict[str, Feature]:
    return {k: Feature(**{kk: vv for kk, vv in v.items()}) for k, v in features.items()}


class LeRobotDriver(RobotDriver):
    """Args:
        name: robot name (also LeRobot's ``id`` unless the config sets one).
        type: LeRobot robot type name, e.g. ``so100_follower``.
        config: the type's config fields (``port``, ``cameras``, ``max_relative_target``, ...)
            as a mapping (decoded with draccus) or a ready ``RobotConfig``.
        module: plugin module that registers ``type`` (third-party robots).
        control_hz: control loop rate (LeRobot's default recording rate is 30 Hz).
        has_operator_device: a leader arm or other teleoperator is attached.
        robot_type: scheduling type (default: ``type`` with ``_`` -> ``-``).
        max_episode_steps: truncation limit (None: episodes end when the operator says).

    Raises:
        ValueError: unknown type or a config field LeRobot rejects.
    """

    def __init__(
        self,
        name: str,
        type: str,
        config: Mapping[str, Any] | Any = None,
        module: str | None = None,
        control_hz: float = 30.0,
        has_operator_device: bool = False,
        robot_type: str | None = None,
        max_episode_steps: int | None = None,
    ) -> None:
        super().__init__(name)
        from lerobot.robots import RobotConfig, make_robot_from_config
        from lerobot.utils.feature_utils import hw_to_dataset_features

        if isinstance(config, RobotConfig):
            cfg = config
        else:
            import draccus

            cfg_cls = robot_config_class(type, module)
            fields = {"id": name, **dict(config or {})}
            try:
                cfg = draccus.decode(cfg_cls, fields)
            except Exception as exc:  # draccus raises several parsing error types
                raise ValueError(f"robot {name}: bad {type} config {fields}: {exc}") from None
        self.robot: Any = make_robot_from_config(cfg)
        hw_obs = self.robot.observation_features
        hw_act = self.robot.action_features
        self._state_keys = [k for k, v in hw_obs.items() if v is float]
        self._camera_keys = [k for k, v in hw_obs.items() if isinstance(v, tuple)]
        self._action_keys = [k for k, v in hw_act.items() if v is float]
        if len(self._action_keys) != len(hw_act):
            raise ValueError(f"robot {name}: only float action features are supported: {hw_act}")
        obs_features = _feature_from_hw(
            hw_to_dataset_features(hw_obs, "observation", use_video=True)
        )
        cams = [
            CameraSpec(name=k, height=hw_obs[k][0], width=hw_obs[k][1], channels=hw_obs[k][2])
            for k in self._camera_keys
        ]
        self.spec = RobotSpec(
            robot_type=robot_type or type.replace("_", "-"),
            observation_features=obs_features,
            action_features=_feature_from_hw(hw_to_dataset_features(hw_act, "action")),
            control_hz=control_hz,
            cameras=cams,
            capabilities=Capabilities(
                can_reset=False, has_operator_device=has_operator_device, simulated=False
            ),
            max_episode_steps=max_episode_steps,
        )

    def _connect(self) -> None:
        # calibrate=False: a fleet robot never prompts on a terminal; calibrate it beforehand.
        try:
            self.robot.connect(calibrate=False)
        except Exception as exc:  # serial, camera and motor-bus errors vary by robot
            raise DriverError(f"robot {self.name}: LeRobot connect failed: {exc}") from exc
        if not self.robot.is_calibrated:
            self.robot.disconnect()
            raise DriverError(
                f"robot {self.name}: not calibrated; run lerobot-calibrate for id {self.robot.id}"
            )

    def _disconnect(self) -> None:
        if self.robot.is_connected:
            self.robot.disconnect()

    def _get_observation(self) -> Observation:
        raw = self.robot.get_observation()
        obs: Observation = {}
        if self._state_keys:
            obs["observation.state"] = np.asarray(
                [raw[k] for k in self._state_keys], dtype=np.float32
            )
        for cam in self._camera_keys:
            obs[f"observation.images.{cam}"] = np.asarray(raw[cam], dtype=np.uint8)
        return obs

    def _apply_action(self, action: NDArray[np.float32]) -> Applied:
        sent = self.robot.send_action(
            {k: float(v) for k, v in zip(self._action_keys, action, strict=True)}
        )
        return Applied(sent=np.asarray([sent[k] for k in self._action_keys], dtype=np.float32))

    def _reset(self, task: str, seed: int | None) -> Observation:
        # A person resets a LeRobot arm; the episode starts from the current state.
        return self._get_observation()

    def _halt(self) -> None:
        # LeRobot has no e-stop call; disconnecting disables torque when the config says so
        # (disable_torque_on_disconnect). Taken under the lock so no write is half sent.
        with self._lock:
            if self._connected:
                self._connected = False
                self._disconnect()

    def _healthy(self) -> bool:
        return bool(self.robot.is_connected)
