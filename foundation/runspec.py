"""The run specification: what a run trains, on which robots, until when.

A run spec is a versioned, typed document (YAML file or JSON through the API). Validation
names every bad field at once (:class:`RunSpecError`), so a launch form can show each error
next to its field. The algorithm and the policy kind are plain names here: the learner's
registry (``cloud_learner.run_plan.parse_spec`` on the launch path) knows which exist and
fills in an algorithm's own policy kind. Example::

    version: 1
    name: reach-and-push
    algorithm: hg-dagger
    tasks: [reach-v3, push-v3]
    robots: {robot_type: metaworld-sawyer, count: 4, min_count: 2}
    stop: {minutes: 10, target_success: 0.9}
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from foundation.rows import RowFilter
from foundation.yamlfile import YamlFileError, load_yaml_file

SPEC_VERSION: Literal[1] = 1

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


ConfigValue = float | int | str | bool | list[int] | list[float] | list[str]


class PolicyConfig(_Strict):
    """The run spec's ``policy:`` section: which policy to train, how big, from which weights.

    Kinds (``cloud_learner`` builds each; robots build the same network from each version's
    policy card): ``mlp`` (state MLP), ``cnn`` (a CNN on the robots' cameras plus the state,
    into the MLP), ``gaussian`` (SAC's tanh-Gaussian actor), ``flow-chunk`` (flow-matching
    action chunks of ``chunk_size`` steps), ``lerobot-act`` / ``lerobot-diffusion`` (LeRobot's
    ACT and Diffusion Policy), ``lerobot-smolvla`` / ``lerobot-pi0`` (only from a local
    ``init_checkpoint`` directory saved by LeRobot's ``save_pretrained``).
    """

    kind: str = Field(
        default="",
        description=(
            "mlp | cnn | gaussian | flow-chunk | lerobot-act | lerobot-diffusion | "
            "lerobot-smolvla | lerobot-pi0; empty or left out: the algorithm's own "
            "(filled in at launch)."
        ),
    )
    hidden_sizes: list[int] = Field(
        default_factory=lambda: [256, 256],
        description="Widths of the hidden layers of the policy's head, any number, any sizes.",
    )
    chunk_size: int = Field(
        default=1,
        ge=1,
        le=256,
        description="Actions per policy call (T); robots execute a whole chunk, and new "
        "weights apply at chunk boundaries.",
    )
    cameras: list[str] | None = Field(
        default=None,
        description="Cameras the policy sees (names of the robots' observation.images.<name>);"
        " default: every camera for cnn and LeRobot kinds, none for the others.",
    )
    config: dict[str, ConfigValue] = Field(
        default_factory=dict,
        description="LeRobot config fields for lerobot-* kinds (e.g. dim_model: 64).",
    )
    init_checkpoint: str | None = Field(
        default=None,
        description="Start from these weights: a robofleet checkpoint (a run's "
        "checkpoints/step-N or a weights .safetensors file) or a LeRobot pretrained_model "
        "directory (config.json + model.safetensors).",
    )
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

    @model_validator(mode="after")
    def _one_start(self) -> PolicyConfig:
        if self.init_checkpoint is not None and self.init_from_run is not None:
            raise ValueError("give init_checkpoint or init_from_run, not both")
        return self


class OfflineSource(_Strict):
    """One source of a run's offline data (``buffer.offline_data``).

    ``source`` is a dataset of the data catalog (``robofleet data ls``), an earlier run's id
    (its buffer), or a path: a robofleet buffer directory, a LeRobotDataset v3 directory or a
    ROS 2 bag. Robofleet buffers are mounted without copying; other formats are imported once
    into the run's offline store. Filters combine with AND.
    """

    source: str = Field(min_length=1, description="Dataset name, run id, or a path.")
    format: str = Field(
        default="auto",
        pattern=r"^[a-z0-9][a-z0-9_-]*$",
        description="auto (detected), or a registered dataset format (lab_data.registry): "
        "robofleet, lerobot, ros2 or a plugin's; checked at launch.",
    )
    tasks: list[str] | None = Field(default=None, description="Keep rows of these tasks only.")
    task: str | None = Field(
        default=None,
        description="The run task every kept row belongs to (for datasets whose task strings "
        "are not the run's task names).",
    )
    robots: list[str] | None = Field(default=None, description="Keep these robot ids only.")
    success_only: bool = Field(default=False, description="Episodes that succeeded only.")
    interventions_only: bool = Field(default=False, description="Operator steps only.")
    time_range: tuple[float, float] | None = Field(
        default=None, description="[t0, t1] on the steps' timestamps (s)."
    )
    options: dict[str, str | list[str]] = Field(
        default_factory=dict,
        description="Import options of a ROS 2 bag: joints (list), state_topic, command_topic.",
    )

    @model_validator(mode="after")
    def _check(self) -> OfflineSource:
        self.rows()  # ValueError: a time_range that ends before it starts
        return self

    def rows(self) -> RowFilter:
        """The source's filter fields as the buffer's row filter (``robots`` are robot ids)."""
        return RowFilter(
            tasks=None if self.tasks is None else tuple(self.tasks),
            robot_ids=None if self.robots is None else tuple(self.robots),
            interventions_only=self.interventions_only,
            success_only=self.success_only,
            time_range=self.time_range,
        )


class AdaptiveMix(_Strict):
    """SOP's adaptive per-task online/offline mix (Pan et al. 2026, "SOP: A Scalable Online
    Post-Training System for VLA Models"): each task's online share follows its recent
    training loss on online rows against offline rows, over a sliding window, clipped."""

    window_updates: int = Field(default=50, ge=1, description="Learner updates in the window.")
    min_online: float = Field(default=0.2, ge=0, le=1)
    max_online: float = Field(default=0.8, ge=0, le=1)

    @model_validator(mode="after")
    def _range(self) -> AdaptiveMix:
        if self.min_online > self.max_online:
            raise ValueError(f"min_online {self.min_online} exceeds max_online {self.max_online}")
        return self


class BufferSpec(_Strict):
    memory_budget_bytes: int | None = Field(default=None, gt=0)
    shards: int = Field(
        default=1,
        ge=1,
        le=64,
        strict=True,
        description=(
            "Buffer shards of the run: 1 = one buffer in the cloud process; N > 1 = N shard"
            " processes (Ray actors, each its own WAL, segments and batch server), robots"
            " hashed to a shard by id. Fixed for the run's life (a resume keeps it)."
        ),
    )
    sampler: Literal[
        "uniform", "recency", "prioritized", "intervention-weighted", "online-offline-mix"
    ] = "uniform"
    online_fraction: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="Online share of each batch when the run has offline data (and SAC's "
        "symmetric halves); the start of every task's share under mix: adaptive.",
    )
    mix: Literal["fixed", "adaptive"] = Field(
        default="fixed",
        description="fixed: online_fraction for every task; adaptive: SOP's per-task share.",
    )
    adaptive: AdaptiveMix = Field(default_factory=AdaptiveMix)
    samples_per_insert: float | None = Field(
        default=None,
        gt=0,
        description=(
            "Sampled rows per online row inserted (Reverb's SampleToInsertRatio, sampling side"
            " only: the learner waits for data, robots are never blocked). 64 at batch 128 ="
            " 0.5 updates per env step. None: only hyperparameters.updates_per_s caps it."
        ),
    )
    min_size: int = Field(
        default=1,
        ge=1,
        strict=True,
        description=(
            "Robot transitions (demonstrations and other offline rows do not count) the"
            " buffer holds before the learner leaves its warm start for online updates."
            " 1: at once (the warm start already trained the first policy on the"
            " demonstrations)."
        ),
    )
    offline_data: list[OfflineSource] = Field(
        default_factory=list,
        description="Offline data mounted into the run: dataset names, run ids or paths, "
        "each a string or a mapping with filters (OfflineSource).",
    )

    @field_validator("offline_data", mode="before")
    @classmethod
    def _strings_are_sources(cls, v: Any) -> Any:
        if isinstance(v, list):
            return [{"source": x} if isinstance(x, str) else x for x in v]
        return v


class DemonstrationSpec(_Strict):
    """A run's demonstration phase on its robots: before the first policy, the robots'
    operators (a person with a keyboard or gamepad, the scripted expert on simulated robots)
    drive ``episodes_per_task`` episodes of each task, split among the leased robots; the
    learner behaviour-clones on them (its warm start), then online training starts."""

    episodes_per_task: int = Field(
        default=0, ge=0, le=1000, description="Demonstrations per task, across the robots."
    )
    wait_s: float = Field(
        default=900.0,
        gt=0,
        description="Longest the learner waits for them before it starts from what it has.",
    )


class PublishSpec(_Strict):
    every_updates: int | None = Field(default=100, ge=1)
    every_seconds: float | None = Field(default=None, gt=0)


class EvalSpec(_Strict):
    """How a run measures success.

    ``on: robots`` (default): every ``every_episodes``-th episode of each robot is a
    policy-only evaluation episode (the operator may only abort it, a failure); success comes
    from the driver's success signal or the operator's label, and a point of the success curve
    is taken every ``every_seconds`` once each task has new evaluation episodes.
    ``on: simulator``: a cloud-side simulated robot of the run's robots' driver kind evaluates
    each snapshot of the policy on ``episodes_per_task`` fixed seeds per task (a kind built
    from the run's tasks and episode limit alone, e.g. the simulated Sawyers; a chunked policy
    executes its chunks row by row).
    ``on: none``: success is not measured (robots that neither detect success nor have an
    operator, e.g. a Gymnasium benchmark without ``is_success``); the run promotes no version.
    """

    on: Literal["robots", "simulator", "none"] = "robots"
    every_seconds: float = Field(default=60.0, gt=0)
    episodes_per_task: int = Field(default=5, ge=1)
    every_episodes: int = Field(default=5, ge=1)


class ClassifierSpec(_Strict):
    """The run's reward classifier (``reward.source: classifier``): trained in the cloud during
    the run from the episodes operators labelled (success endings vs failures, HIL-SERL's
    recipe), versioned and shipped to the robots beside the policy, run there on every step."""

    min_labelled_episodes: int = Field(
        default=10,
        ge=2,
        description="Labelled episodes (at least one success and one failure) before the "
        "first classifier version; until then the robots' operators label.",
    )
    threshold: float = Field(
        default=0.5, gt=0, lt=1, description="P(success) at or above which a step is a success."
    )
    holdout_fraction: float = Field(
        default=0.25,
        ge=0,
        lt=1,
        description="Share of the labelled episodes kept out of training to measure the "
        "classifier's precision and recall.",
    )
    every_updates: int = Field(
        default=200,
        ge=1,
        description="Learner updates between checks for new labels (a retraining when any).",
    )


class RewardSpec(_Strict):
    """Where a run's reward comes from (``reward.source``):

    * ``robot``: the driver's own reward (only robots that report one: dense or sparse);
    * ``labels``: the operator's verdict: 1 on the verdict step of a success episode, else 0
      (HIL-SERL's sparse terminal reward); the verdict ends the episode;
    * ``classifier``: a reward classifier trained from the operators' labels
      (:class:`ClassifierSpec`) gives the reward on the robot and proposes success.
    """

    source: Literal["robot", "labels", "classifier"] = "robot"
    classifier: ClassifierSpec = Field(default_factory=ClassifierSpec)


class HelpSpec(_Strict):
    """When a robot asks a person for help (``help:``), before it fails.

    ``risk`` is the signal the robot computes at every step, without a simulator's help:
    ``probe`` (a small probe on the policy's hidden activations, trained in the cloud from the
    run's own steps: positive when an operator took over or a failure verdict came within
    ``probe_horizon`` steps; shipped beside the policy like the reward classifier) or
    ``ensemble`` (the spread of the actions of the last ``ensemble_members`` policy versions
    the robot applied, on the same observation); ``none``: robots never ask. A risk at or
    above ``threshold`` opens one request; the next needs the risk to fall below
    ``threshold - hysteresis`` first and ``cooldown_steps`` steps after the last one ended.
    ``random`` (a baseline): the risk is 1 with probability ``random_rate`` at each step, else 0.

    ``operators`` is how many people the run has (None: one at each robot). Fewer than robots:
    the cloud assigns open requests to free operators, highest risk first
    (``foundation.store.help_assignments``), and a simulated robot's scripted person acts only
    while the cloud assigned one to it, for at most ``on_call_steps`` steps of the episode
    (``edge_agent.on_call``). ``simulated_operators``: the cloud plays the ``operators``
    people itself (``runs.help_dispatch``; simulated fleets and benchmarks).
    """

    risk: Literal["probe", "ensemble", "random", "none"] = "none"
    threshold: float = Field(default=0.5, ge=0, le=1, description="Risk (0-1) that asks.")
    hysteresis: float = Field(
        default=0.1, ge=0, le=1, description="How far the risk falls before it may ask again."
    )
    cooldown_steps: int = Field(
        default=20, ge=0, description="Steps after a request ends before the next may open."
    )
    while_waiting: Literal["hold", "continue"] = Field(
        default="hold",
        description="hold: the robot sends no action until answered or expired; continue: the "
        "policy goes on acting.",
    )
    timeout_s: float = Field(
        default=60.0, gt=0, description="Seconds a request waits before it expires."
    )
    probe_horizon: int = Field(
        default=10, ge=1, le=1000, description="K: steps ahead a probe label looks."
    )
    ensemble_members: int = Field(
        default=3, ge=2, le=8, description="Policy versions the ensemble compares."
    )
    probe_every_updates: int = Field(
        default=200, ge=1, description="Learner updates between trainings of the probe."
    )
    probe_episodes: int = Field(
        default=50, ge=2, le=1000, description="Latest policy episodes a probe learns from."
    )
    random_rate: float = Field(
        default=0.02, ge=0, le=1, description="random: chance of a request at each step."
    )
    operators: int | None = Field(
        default=None, ge=1, description="People the run has (None: one at each robot)."
    )
    simulated_operators: bool = Field(
        default=False, description="The cloud plays the operators (simulated fleets)."
    )
    on_call_steps: int | None = Field(
        default=None,
        ge=1,
        description="Steps an on-call person drives once assigned (None: rest of the episode).",
    )


class StopSpec(_Strict):
    minutes: float | None = Field(default=None, gt=0)
    env_steps: int | None = Field(default=None, gt=0)
    target_success: float | None = Field(default=None, gt=0, le=1)


class RunSpec(_Strict):
    """A complete, validated run specification (version 1)."""

    version: Literal[1] = SPEC_VERSION
    name: str = Field(default="", max_length=256)
    algorithm: str = Field(
        min_length=1,
        description="hg-dagger | recap | sac: an algorithm of the cloud's learner (checked at "
        "launch against its registry).",
    )
    hyperparameters: dict[str, float | int | str | bool] = Field(default_factory=dict)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    tasks: list[str] = Field(min_length=1, description="Meta-World or other task names.")
    robots: RobotDemand
    learner: LearnerResources = Field(default_factory=LearnerResources)
    buffer: BufferSpec = Field(default_factory=BufferSpec)
    demonstrations: DemonstrationSpec = Field(default_factory=DemonstrationSpec)
    publish: PublishSpec = Field(default_factory=PublishSpec)
    evaluation: EvalSpec = Field(default_factory=EvalSpec)
    reward: RewardSpec = Field(default_factory=RewardSpec)
    help: HelpSpec = Field(default_factory=HelpSpec)
    stop: StopSpec = Field(default_factory=StopSpec)

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
        if list(errors) == ["(file)"]:  # the file itself: one line that names it
            super().__init__(errors["(file)"])
            return
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


def load_run_spec(path: Path | str, parse: Callable[[Any], RunSpec] = parse_run_spec) -> RunSpec:
    """Read a YAML or JSON run spec file and validate it with ``parse`` (the launch path's
    parser also checks the names only the learner knows).

    Raises:
        RunSpecError: the file is missing, unparsable, or invalid.
    """
    p = Path(path)
    if not p.is_file():
        raise RunSpecError({"(file)": f"not found: {p}"})
    try:
        data = load_yaml_file(path)
    except YamlFileError as exc:
        raise RunSpecError({"(file)": str(exc)}) from None
    return parse(data)


# -- hyper-parameters ------------------------------------------------------------------------
#
# ``spec.hyperparameters`` is one flat mapping. The knobs every run has are :class:`RunParams`;
# each algorithm declares its own in its module (``cloud_learner.algorithms``), with the same
# :func:`knob` fields, and ``cloud_learner.run_plan.RunPlan.from_spec`` splits the mapping
# between them.


def knob(
    default: float | int,
    *,
    zero_ok: bool = False,
    signed: bool = False,
    within: tuple[Callable[[float], bool], str] | None = None,
) -> Any:
    """A hyper-parameter field: positive by default (``zero_ok`` admits 0, ``signed`` any
    real number), optionally ``within`` a range given as (predicate, text), e.g.
    ``(lambda v: 0 < v < 1, "(0, 1)")``. Its type (int or float) is the annotation's."""
    return field(default=default, metadata={"zero_ok": zero_ok, "signed": signed, "within": within})


def knob_names(cls: type) -> set[str]:
    return {f.name for f in fields(cls)}


def parse_knobs[K](cls: type[K], values: Mapping[str, Any]) -> tuple[K | None, dict[str, str]]:
    """``cls(**values)`` checked field by field; (None, errors) when any is bad.

    Errors map ``hyperparameters.<key>`` to why: not a number, not an integer, not positive,
    out of its range. Keys that are not fields of ``cls`` are the caller's to report.
    """
    known = {f.name: f for f in fields(cls)}  # type: ignore[arg-type]
    errors: dict[str, str] = {}
    out: dict[str, Any] = {}
    for key, value in values.items():
        f = known[key]
        want = int if f.type in ("int", int) else float
        where = f"hyperparameters.{key}"
        if isinstance(value, bool) or not isinstance(value, int | float):
            errors[where] = f"must be a number, got {value!r}"
        elif want is int and not float(value).is_integer():
            errors[where] = f"must be an integer, got {value!r}"
        elif not f.metadata["signed"] and (value < 0 or (value == 0 and not f.metadata["zero_ok"])):
            errors[where] = f"must be positive, got {value!r}"
        elif f.metadata["within"] is not None and not f.metadata["within"][0](value):
            errors[where] = f"must be in {f.metadata['within'][1]}, got {value!r}"
        else:
            out[key] = want(value)
    if errors:
        return None, errors
    return cls(**out), errors


@dataclass(frozen=True)
class RunParams:
    """The knobs of every run, with their defaults (``spec.hyperparameters`` overrides by name).

    Attributes:
        lr: learning rate of the policy's optimizer.
        batch_size: rows per update.
        bc_updates: behaviour-cloning updates on the demonstrations and offline data before
            the first policy (the weak initial policy).
        updates_per_s: upper bound on learner updates per second (0 = unbounded); keeps the
            learner from starving real-time robots on small machines.
        checkpoint_every_updates: learner checkpoint cadence.
        control_hz: robots' control rate (Hz).
        max_episode_steps: training episode length (steps).
        eval_max_steps: evaluation episode limit (steps).
        min_state_std: floor of the state normalisation's standard deviation.
        seed: learner seed.
    """

    lr: float = knob(1e-3)
    batch_size: int = knob(128)
    bc_updates: int = knob(300, zero_ok=True)
    updates_per_s: float = knob(40.0, zero_ok=True)
    checkpoint_every_updates: int = knob(200)
    control_hz: float = knob(20.0)
    max_episode_steps: int = knob(100)
    eval_max_steps: int = knob(100)
    min_state_std: float = knob(0.05)
    seed: int = knob(0, zero_ok=True)
