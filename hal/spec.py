"""RobotSpec: what a robot observes and accepts, known before connecting.

Features use LeRobot's dataset feature layout (``lerobot.utils.feature_utils``), e.g.::

    {"observation.state": {"dtype": "float32", "shape": (39,), "names": ["hand_x", ...]},
     "observation.images.corner": {"dtype": "video", "shape": (64, 64, 3),
                                   "names": ["height", "width", "channels"]},
     "action": {"dtype": "float32", "shape": (4,), "names": ["dx", "dy", "dz", "grip"]}}

A spec is plain data (``to_dict`` / ``from_dict``) so it is stored as ``Robot.spec`` in the
metadata store and sent to the control plane unchanged.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

IMAGE_DTYPES = {"image", "video"}
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")


class Feature(BaseModel):
    """One entry of a LeRobot feature dict.

    ``dtype`` is a numpy dtype name (``float32``) or ``image``/``video`` (uint8, HxWxC);
    ``shape`` is the array shape; ``names`` label the last axis of vectors.
    """

    model_config = ConfigDict(frozen=True, extra="allow")

    dtype: str
    shape: tuple[int, ...]
    names: list[str] | None = None

    @field_validator("shape")
    @classmethod
    def _positive(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if any(d <= 0 for d in v):
            raise ValueError(f"every dimension must be positive, got {v}")
        return v

    @model_validator(mode="after")
    def _names_match(self) -> Feature:
        if self.dtype not in IMAGE_DTYPES and self.names is not None and len(self.shape) == 1:
            if len(self.names) != self.shape[0]:
                raise ValueError(f"{len(self.names)} names for shape {self.shape}")
        return self

    @property
    def is_image(self) -> bool:
        return self.dtype in IMAGE_DTYPES

    @property
    def numpy_dtype(self) -> str:
        return "uint8" if self.is_image else self.dtype


class CameraSpec(BaseModel):
    """A camera whose frames appear as ``observation.images.<name>`` (uint8, HxWxC)."""

    model_config = ConfigDict(frozen=True)

    name: str
    height: int = Field(gt=0)
    width: int = Field(gt=0)
    channels: int = Field(default=3, ge=1, le=4)


class Capabilities(BaseModel):
    """What a driver can do beyond the contract."""

    model_config = ConfigDict(frozen=True)

    can_reset: bool = Field(description="Resets itself to a start state without a human.")
    has_operator_device: bool = Field(
        default=False, description="A teleoperation device (leader arm, spacemouse) is attached."
    )
    simulated: bool = Field(description="A simulator, not hardware.")
    multi_task: bool = Field(default=False, description="Can switch task between episodes.")
    reward: Literal["dense", "sparse", "none"] = Field(
        default="none",
        description="The reward the robot itself reports each step: dense (shaped, every "
        "step), sparse (at success only) or none (an arm: 0 on every step). A run's "
        "reward.source robot needs dense or sparse.",
    )
    detects_success: bool = Field(
        default=False,
        description="The robot itself reports success (EpisodeState.success); without it "
        "success comes from an operator's verdict or a reward classifier.",
    )


class RobotSpec(BaseModel):
    """Everything the scheduler and the learner need to know about a robot.

    Attributes:
        robot_type: scheduling class, e.g. ``metaworld-sawyer``; robots of one type are
            interchangeable for a run (Ray resource ``robot/<robot_type>``).
        observation_features / action_features: LeRobot feature dicts (see module doc).
        control_hz: control loop rate in Hz (steps per second of robot time).
        action_low / action_high: per-dimension safety bounds of ``action``; ``send_action``
            clips to them. None means unbounded.
        max_episode_steps: episodes are truncated after this many steps (None: no limit).
        tasks: task names the robot can run (empty: one fixed task).
    """

    model_config = ConfigDict(frozen=True)

    robot_type: str
    observation_features: dict[str, Feature]
    action_features: dict[str, Feature]
    control_hz: float = Field(gt=0)
    cameras: list[CameraSpec] = Field(default_factory=list)
    capabilities: Capabilities
    action_low: list[float] | None = None
    action_high: list[float] | None = None
    max_episode_steps: int | None = Field(default=None, gt=0)
    tasks: list[str] = Field(default_factory=list)

    @field_validator("robot_type")
    @classmethod
    def _valid_type(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ValueError(f"robot_type {v!r} must be 1-128 of [A-Za-z0-9_.-]")
        return v

    @model_validator(mode="after")
    def _check(self) -> RobotSpec:
        if "action" not in self.action_features:
            raise ValueError("action_features must contain 'action'")
        n = self.action_dim
        for side, bound in (("action_low", self.action_low), ("action_high", self.action_high)):
            if bound is not None and len(bound) != n:
                raise ValueError(f"{side} has {len(bound)} values, action has {n}")
        if self.action_low is not None and self.action_high is not None:
            if any(lo > hi for lo, hi in zip(self.action_low, self.action_high, strict=True)):
                raise ValueError("action_low exceeds action_high")
        for cam in self.cameras:
            key = f"observation.images.{cam.name}"
            feat = self.observation_features.get(key)
            if feat is None or feat.shape != (cam.height, cam.width, cam.channels):
                raise ValueError(f"camera {cam.name!r} needs feature {key} of its shape")
        return self

    @property
    def action_dim(self) -> int:
        shape = self.action_features["action"].shape
        return int(shape[0]) if shape else 1

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready plain data (shapes become lists)."""
        return self.model_dump(mode="json")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RobotSpec:
        """Inverse of :meth:`to_dict`. Raises pydantic.ValidationError naming bad fields."""
        return cls.model_validate(data)


def validate_name(name: str, what: str = "robot name") -> str:
    """Return ``name`` or raise ValueError when it cannot be a Ray resource / DB key."""
    if not _NAME_RE.match(name):
        raise ValueError(f"{what} {name!r} must be 1-128 of [A-Za-z0-9_.-], starting alphanumeric")
    return name
