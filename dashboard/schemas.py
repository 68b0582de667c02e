"""Request and response bodies of the REST API (they make up the OpenAPI description)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, StringConstraints, model_validator

from comms.cloud.enrollment_tokens import DRIVER_PATTERN, KEY_PATTERN
from foundation.store.accounts import Role
from foundation.store.models import RobotStatus, RunState


class Message(BaseModel):
    detail: str


class LoginRequest(BaseModel):
    username: str = Field(min_length=1, max_length=64)
    password: str = Field(min_length=1, max_length=1024)


class Me(BaseModel):
    username: str
    role: Role
    via: str = Field(description="session (browser) or api (bearer token)")
    csrf_token: str | None = Field(
        default=None, description="send as X-CSRF-Token on unsafe requests of this session"
    )


class PasswordChange(BaseModel):
    current_password: str = Field(min_length=1, max_length=1024)
    new_password: str = Field(min_length=1, max_length=1024)


class UserOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int
    username: str
    role: Role
    disabled: bool
    created_at: datetime


class UserCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    username: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.@-]+$")
    password: str = Field(min_length=1, max_length=1024)
    role: Role


class UserUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Role | None = None
    disabled: bool | None = None
    password: str | None = Field(default=None, min_length=1, max_length=1024)


class ApiTokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=128)
    ttl_days: float | None = Field(default=None, gt=0, le=3650, description="None = no expiry")


class ApiTokenOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int
    name: str
    created_at: datetime
    expires_at: datetime | None
    last_used_at: datetime | None
    revoked_at: datetime | None


class ApiTokenCreated(ApiTokenOut):
    token: str = Field(description="shown once; only its hash is stored")


class SiteOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int
    name: str
    description: str


class SiteCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=128)
    description: str = Field(default="", max_length=2000)


ActivityState = Literal[
    "idle", "assigned", "leased", "refused", "offline", "estopped", "unhealthy", "enrolled",
    "retired",
]  # fmt: skip


class RobotActivity(BaseModel):
    """What a robot does now (``dashboard.robot_view.activity``)."""

    state: ActivityState = Field(
        description=(
            "idle; assigned (acting in run_id); leased (held by run_id, not acting yet);"
            " refused (its computer refused run_id, see reason); offline; estopped;"
            " unhealthy; enrolled (never heard from); retired"
        )
    )
    run_id: str | None = Field(
        default=None, description="the run it acts in, is leased to or refused"
    )
    run_state: str | None = Field(
        default=None,
        description=(
            "its heartbeat's state in the run: starting, running, resetting (waiting for its"
            " operator's ready), paused, estopped, stopped"
        ),
    )
    reason: str | None = Field(default=None, description="why its computer refused the run")


class CameraOut(BaseModel):
    name: str
    height: int
    width: int


class RobotSpecSummary(BaseModel):
    """The robot's enrolled spec in brief, and what its computer runs."""

    observation: dict[str, list[int]] = Field(description="observation feature -> shape")
    action: list[int] | None = Field(description="shape of the action")
    cameras: list[CameraOut]
    control_hz: float | None = Field(description="control rate, Hz")
    driver: str | None = Field(description="the robot computer's hal driver")
    operator: str | None = Field(description="the robot computer's operator device")


class RobotOut(BaseModel):
    id: int
    name: str
    robot_type: str
    status: RobotStatus
    site: str | None
    tags: dict[str, Any]
    last_heartbeat_at: datetime | None
    heartbeat_age_s: float | None = Field(description="seconds since the last heartbeat")
    leased_run_id: str | None
    applied_policy_version: int | None
    control_loop_p99_ms: float | None = Field(description="from the robot's heartbeat stats")
    stats: dict[str, Any]
    activity: RobotActivity
    spec_summary: RobotSpecSummary


Key = Annotated[str, StringConstraints(pattern=KEY_PATTERN)]
_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
_KIND = r"^[a-z0-9][a-z0-9_-]{0,63}$"


class EnrollmentRequest(BaseModel):
    """What the robot that uses the token is, and what its computer runs (the command)."""

    model_config = ConfigDict(extra="forbid")
    robot_name: str | None = Field(default=None, min_length=1, max_length=128, pattern=_NAME)
    robot_type: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        pattern=_NAME,
        description="scheduling type (default: its driver's)",
    )
    ttl_s: int | None = Field(default=None, gt=0, le=30 * 24 * 3600)
    tags: dict[Key, Annotated[str, Field(max_length=256)]] = Field(
        default_factory=dict, description="given to the robot; run specs select robots by them"
    )
    driver: str | None = Field(
        default=None,
        pattern=DRIVER_PATTERN,
        description="hal driver: metaworld, gymnasium, lerobot, ros2, or a lab's own "
        "(a robofleet.drivers entry point name or module.path:ClassName)",
    )
    driver_options: dict[Key, JsonValue] = Field(
        default_factory=dict,
        description="--driver-option KEY=VALUE each (a value not a string is written as JSON)",
    )
    operator: str | None = Field(
        default=None,
        pattern=_KIND,
        description="none, scripted, keyboard, gamepad, lerobot, spacemouse",
    )
    operator_options: dict[Key, JsonValue] = Field(
        default_factory=dict,
        description="--operator-option KEY=VALUE each, for lerobot or spacemouse "
        "(a value not a string is written as JSON)",
    )

    @model_validator(mode="after")
    def _options_need_an_operator(self) -> EnrollmentRequest:
        if self.operator_options and not self.operator:
            raise ValueError("operator_options need an operator (lerobot, spacemouse)")
        return self


class EnrollmentCreated(BaseModel):
    token: str = Field(description="one-time token; shown once")
    expires_at: datetime
    command: str = Field(
        description="the exact `robofleet edge` command to run on the robot computer"
    )


class EnrollmentTokenOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int
    robot_name: str | None
    robot_type: str | None
    tags: dict[str, Any]
    site_id: int | None
    created_at: datetime
    expires_at: datetime
    used_at: datetime | None
    used_by_robot_id: int | None


class RunOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: str
    name: str
    algorithm: str
    state: RunState
    spec: dict[str, Any]
    run_dir: str
    reason: str
    created_at: datetime
    updated_at: datetime


class RunDetail(RunOut):
    leased_robots: list[str]


class RunCreated(BaseModel):
    id: str
    state: RunState


class MetricPoint(BaseModel):
    id: int
    name: str
    step: int
    wall_time: float
    value: float
    robot_id: int | None
    task: str | None


class PolicyVersionOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int
    run_id: str
    version: int
    learner_step: int
    sha256: str
    num_bytes: int
    promoted: bool
    created_at: datetime


class CheckpointOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int
    run_id: str
    learner_step: int
    policy_version: int
    path: str
    created_at: datetime


class EventOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int
    created_at: datetime
    kind: str
    actor: str
    run_id: str | None
    robot_id: int | None
    data: dict[str, Any]
