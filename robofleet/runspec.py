"""The run specification: what a run trains, on which robots, until when.

A run spec is a versioned, typed document (YAML file or JSON through the API). Validation
names every bad field at once (:class:`RunSpecError`), so a launch form can show each error
next to its field. Example::

    version: 1
    name: reach-and-push
    algorithm: hg-dagger
    tasks: [reach-v3, push-v3]
    robots: {robot_type: metaworld-sawyer, count: 4, min_count: 2}
    stop: {minutes: 10, target_success: 0.9}
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

SPEC_VERSION: Literal[1] = 1

Algorithm = Literal["hg-dagger", "recap", "sac"]
# The policy each algorithm trains when the spec names none (SAC's actor is a tanh-Gaussian).
DEFAULT_POLICY_KIND: dict[str, str] = {"hg-dagger": "mlp", "recap": "mlp", "sac": "gaussian"}
TASK_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RobotDemand(_Strict):
    """Which robots a run asks for. Robots are matched by type and/or tags."""

    robot_type: str | None = Field(default=None, description="e.g. 'metaworld-sawyer'.")
    tags: dict[str, str] = Field(
        default_factory=dict, description="All must match the robot's tags."
    )
    count: int = Field(default=1, ge=1, le=1024, description="Robots wanted.")
    min_count: int | None = Field(
        default=None, ge=1, description="Fewest to start (default: count)."
    )

    @model_validator(mode="after")
    def _check(self) -> RobotDemand:
        if self.robot_type is None and not self.tags:
            raise ValueError("give robot_type or tags")
        if self.min_count is not None and self.min_count > self.count:
            raise ValueError(f"min_count ({self.min_count}) exceeds count ({self.count})")
        return self

    @property
    def minimum(self) -> int:
        return self.min_count if self.min_count is not None else self.count


class LearnerResources(_Strict):
    num_cpus: float = Field(default=1.0, gt=0)
    num_gpus: float = Field(default=0.0, ge=0)


class PolicySpec(_Strict):
    """The policy architecture; ``kind`` names a policy in cloud_learner."""

    kind: str = Field(
        default="mlp",
        description=(
            "mlp | gaussian | cnn | flow-chunk | lerobot-act ...; in a run spec that leaves it "
            "out, the algorithm's own (DEFAULT_POLICY_KIND)."
        ),
    )
    hidden_sizes: list[int] = Field(default_factory=lambda: [256, 256])
    chunk_size: int = Field(default=1, ge=1, le=256)
    init_checkpoint: str | None = Field(default=None, description="Start from these weights.")
    init_from_run: str | None = Field(
        default=None,
        max_length=64,
        description="Start from this run's promoted policy version instead of random weights.",
    )

    @field_validator("hidden_sizes")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if not v or any(h <= 0 for h in v):
            raise ValueError("hidden sizes must be a non-empty list of positive integers")
        return v


class BufferSpec(_Strict):
    memory_budget_bytes: int | None = Field(default=None, gt=0)
    sampler: Literal[
        "uniform", "recency", "prioritized", "intervention-weighted", "online-offline-mix"
    ] = "uniform"
    online_fraction: float = Field(
        default=0.5, ge=0, le=1, description="Online share of each batch."
    )
    samples_per_insert: float | None = Field(
        default=None,
        gt=0,
        description=(
            "Sampled rows per online row inserted (Reverb's SampleToInsertRatio, sampling side"
            " only: the learner waits for data, robots are never blocked). 64 at batch 128 ="
            " 0.5 updates per env step. None: only hyperparameters.updates_per_s caps it."
        ),
    )
    min_size: int = Field(default=256, ge=1, description="Transitions before training starts.")
    offline_data: list[str] = Field(
        default_factory=list, description="Buffer dirs or LeRobot datasets to mount."
    )


class PublishSpec(_Strict):
    every_updates: int | None = Field(default=100, ge=1)
    every_seconds: float | None = Field(default=None, gt=0)


class EvalSpec(_Strict):
    every_seconds: float = Field(default=60.0, gt=0)
    episodes_per_task: int = Field(default=5, ge=1)


class StopSpec(_Strict):
    minutes: float | None = Field(default=None, gt=0)
    env_steps: int | None = Field(default=None, gt=0)
    target_success: float | None = Field(default=None, gt=0, le=1)


class RunSpec(_Strict):
    """A complete, validated run specification (version 1)."""

    version: Literal[1] = SPEC_VERSION
    name: str = Field(default="", max_length=256)
    algorithm: Algorithm
    hyperparameters: dict[str, float | int | str | bool] = Field(default_factory=dict)
    policy: PolicySpec = Field(default_factory=PolicySpec)
    tasks: list[str] = Field(min_length=1, description="Meta-World or other task names.")
    robots: RobotDemand
    learner: LearnerResources = Field(default_factory=LearnerResources)
    buffer: BufferSpec = Field(default_factory=BufferSpec)
    publish: PublishSpec = Field(default_factory=PublishSpec)
    evaluation: EvalSpec = Field(default_factory=EvalSpec)
    stop: StopSpec = Field(default_factory=StopSpec)

    @model_validator(mode="before")
    @classmethod
    def _policy_kind_for_algorithm(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("algorithm") not in DEFAULT_POLICY_KIND:
            return data
        policy = data.get("policy", {})
        if isinstance(policy, dict) and policy.get("kind") in (None, ""):
            kind = DEFAULT_POLICY_KIND[data["algorithm"]]
            return {**data, "policy": {**policy, "kind": kind}}
        return data

    @field_validator("tasks")
    @classmethod
    def _unique_tasks(cls, v: list[str]) -> list[str]:
        problems = []
        dupes = sorted({t for t in v if v.count(t) > 1})
        if dupes:
            problems.append(f"tasks listed twice (must not repeat): {', '.join(dupes)}")
        bad = [t for t in v if not TASK_PATTERN.fullmatch(t)]
        if bad:
            names = ", ".join(map(repr, bad))
            problems.append(f"not task names (letters, digits, '-', '_', '.'): {names}")
        if problems:
            raise ValueError("; ".join(problems))
        return v


class RunSpecError(ValueError):
    """A run spec is invalid. ``errors`` maps a dotted field path to its message."""

    def __init__(self, errors: dict[str, str]) -> None:
        self.errors = errors
        super().__init__(
            "invalid run spec:\n  " + "\n  ".join(f"{k}: {v}" for k, v in errors.items())
        )


def field_errors(err: ValidationError) -> dict[str, str]:
    """Dotted field path -> message, one per bad field."""
    out: dict[str, str] = {}
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(spec)"
        msg = (
            "unknown field"
            if e["type"] == "extra_forbidden"
            else e["msg"].removeprefix("Value error, ")
        )
        out.setdefault(key, msg)
    return out


def parse_run_spec(data: Any) -> RunSpec:
    """Validate a run spec given as a mapping.

    Raises:
        RunSpecError: naming every invalid field.
    """
    if not isinstance(data, dict):
        raise RunSpecError({"(spec)": "a run spec must be a mapping"})
    try:
        return RunSpec.model_validate(data)
    except ValidationError as err:
        raise RunSpecError(field_errors(err)) from None


def load_run_spec(path: Path | str) -> RunSpec:
    """Read and validate a YAML or JSON run spec file.

    Raises:
        RunSpecError: the file is missing, unparsable, or invalid.
    """
    p = Path(path)
    if not p.is_file():
        raise RunSpecError({"(file)": f"not found: {p}"})
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise RunSpecError({"(file)": f"not valid YAML: {exc}"}) from None
    return parse_run_spec(data)
