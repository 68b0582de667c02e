"""The run specification a launch request carries, validated field by field.

Errors come back as FastAPI's standard 422 body: ``{"detail": [{"loc": ["body", "robots",
"count"], "msg": "...", "type": "..."}]}``; the launch form shows each message next to the
field named by ``loc``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

Algorithm = Literal["hg-dagger", "recap", "sac"]
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9 ._-]*$"
TASK_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RobotSelector(_Strict):
    """Which robots the run leases: all that match ``robot_type`` and every tag, ``count`` of them."""

    robot_type: str | None = Field(
        default=None, min_length=1, max_length=128, description="e.g. metaworld-sawyer"
    )
    tags: dict[str, str] = Field(default_factory=dict, description="every tag must match")
    count: int = Field(default=1, ge=1, le=1024, description="robots to lease")


class PolicyChoice(_Strict):
    """The policy network (``cloud_learner.policies``) and where its first weights come from."""

    kind: Literal["mlp", "gaussian", "flow"] = Field(
        default="mlp", description="mlp (BC head), gaussian (SAC actor), flow (flow-matching)"
    )
    hidden: int = Field(default=256, ge=8, le=8192, description="hidden layer width")
    depth: int = Field(default=2, ge=1, le=16, description="hidden layers")
    chunk_size: int = Field(default=1, ge=1, le=256, description="actions per chunk (T)")
    init_from_run: str | None = Field(
        default=None,
        max_length=64,
        description="start from this run's promoted policy version instead of random weights",
    )


class HyperParameters(_Strict):
    """The main knobs of the learner and buffer."""

    batch_size: int = Field(default=256, ge=1, le=65536)
    learning_rate: float = Field(default=3e-4, gt=0, le=1)
    samples_per_insert: float = Field(
        default=4.0, gt=0, le=1024, description="rate limiter: samples drawn per step inserted"
    )
    online_fraction: float = Field(
        default=0.5, ge=0, le=1, description="share of each batch from online data (RLPD mix)"
    )
    discount: float = Field(default=0.99, gt=0, le=1, description="gamma (RECAP, SAC)")
    publish_every: int = Field(default=100, ge=1, description="updates between policy versions")
    checkpoint_every: int = Field(default=1000, ge=1, description="updates between checkpoints")
    max_updates: int = Field(default=100_000, ge=1, description="the run finishes after this")


class RunSpec(_Strict):
    """Everything needed to launch a run; stored as ``runs.spec`` (JSON)."""

    name: str = Field(min_length=1, max_length=200, pattern=NAME_PATTERN)
    algorithm: Algorithm
    tasks: list[str] = Field(
        min_length=1, max_length=64, description="Meta-World task names, e.g. reach-v3"
    )
    robots: RobotSelector = Field(default_factory=RobotSelector)
    policy: PolicyChoice = Field(default_factory=PolicyChoice)
    hyperparameters: HyperParameters = Field(default_factory=HyperParameters)

    @field_validator("tasks")
    @classmethod
    def _tasks_valid(cls, tasks: list[str]) -> list[str]:
        import re

        for t in tasks:
            if not re.fullmatch(TASK_PATTERN, t) or len(t) > 128:
                raise ValueError(f"{t!r} is not a task name (letters, digits, '-', '_', '.')")
        dupes = sorted({t for t in tasks if tasks.count(t) > 1})
        if dupes:
            raise ValueError(f"tasks listed twice: {', '.join(dupes)}")
        return tasks
