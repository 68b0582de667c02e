"""The gateway robot's description, from the features of LeRobot's training config.

LeRobot's actor runs from a ``TrainRLServerPipelineConfig`` JSON whose ``policy`` holds
``input_features`` (``{"observation.state": {"type": "STATE", "shape": [18]},
"observation.images.front": {"type": "VISUAL", "shape": [3, 128, 128]}}``) and
``output_features`` (``{"action": {"type": "ACTION", "shape": [4]}}``). The same file gives
the gateway its robot spec (what the cloud matches runs to) and the step schema every
transition is checked against: vectors are ``float32`` of the given shape; a ``VISUAL``
feature ``(C, H, W)`` (LeRobot's float images in ``[0, 1]``) is stored as a ``uint8`` image
``(H, W, C)``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from buffer.table.schema import StepSchema
from hal.spec import Capabilities, Feature, RobotSpec


@dataclass(frozen=True)
class ActorConfig:
    """What the gateway reads from LeRobot's config.

    Attributes:
        spec: the robot's spec (``robot_type``, features in robofleet's layout).
        port: ``policy.actor_learner_config.learner_port`` (where the actor connects).
        fps: ``env.fps`` (steps per second; 10 when the config has none).
    """

    spec: RobotSpec
    port: int
    fps: float

    def schema(self) -> StepSchema:
        """The step schema every transition is checked against."""
        obs = {k: f.model_dump() for k, f in self.spec.observation_features.items()}
        act = {k: f.model_dump() for k, f in self.spec.action_features.items()}
        return StepSchema.from_features(obs, act)


def _feature(name: str, spec: Any) -> Feature:
    try:
        kind, shape = str(spec["type"]).upper(), tuple(int(d) for d in spec["shape"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"feature {name!r}: needs a type and a shape, got {spec!r}") from None
    if kind == "VISUAL":
        if len(shape) != 3:
            raise ValueError(f"feature {name!r}: an image needs shape (C, H, W), got {shape}")
        c, h, w = shape
        return Feature(dtype="image", shape=(h, w, c))
    return Feature(dtype="float32", shape=shape)


def actor_config(data: dict[str, Any], robot_type: str = "lerobot-actor") -> ActorConfig:
    """Read LeRobot's training config (parsed JSON).

    Raises:
        ValueError: no ``policy.input_features`` / ``output_features``, no ``action`` output,
            no ``observation.*`` input, or a feature without type and shape (named).
    """
    policy = data.get("policy") or {}
    inputs, outputs = policy.get("input_features"), policy.get("output_features")
    if not isinstance(inputs, dict) or not isinstance(outputs, dict):
        raise ValueError("the LeRobot config has no policy.input_features / output_features")
    if "action" not in outputs:
        raise ValueError(f"the LeRobot config's outputs {sorted(outputs)} have no 'action'")
    obs = {k: _feature(k, v) for k, v in inputs.items() if k.startswith("observation.")}
    if not obs:
        raise ValueError(f"the LeRobot config's inputs {sorted(inputs)} have no observation.*")
    links = policy.get("actor_learner_config") or {}
    fps = (data.get("env") or {}).get("fps") or 10
    spec = RobotSpec(
        robot_type=robot_type,
        observation_features=obs,
        action_features={"action": _feature("action", outputs["action"])},
        control_hz=float(fps),
        capabilities=Capabilities(can_reset=True, simulated=False, reward="sparse"),
    )
    return ActorConfig(spec, int(links.get("learner_port", 50051)), float(fps))


def read_actor_config(path: Path, robot_type: str = "lerobot-actor") -> ActorConfig:
    """:func:`actor_config` of the JSON file at ``path``.

    Raises:
        OSError: unreadable file. ValueError: not JSON, or as :func:`actor_config`.
    """
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    return actor_config(data, robot_type)
