"""What the cloud tells an idle robot computer when a run leases its robot.

The cloud sends an :class:`Assignment` as JSON in a ``ControlCommand`` of kind ``ASSIGN``
(never pickled); the robot computer (:mod:`edge_agent.host`) validates it here and builds the
run's edge agent from it and its own settings. The split of settings:

* **the run's** (:data:`RUN_EDGE_FIELDS`): control rate, when to apply new weights, the
  HG-DAgger gate, how episodes are committed: every robot of a run follows one rule;
* **the robot's own**: driver, operator device, spool, heartbeat period, risk regions,
  real-time priority, inference placement: what only the robot computer knows.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from edge_agent.config import EdgeSettings

# EdgeSettings fields a run sets for all its robots (the rest stay the robot computer's).
RUN_EDGE_FIELDS = (
    "control_hz",
    "weight_apply_at",
    "weight_apply_every_steps",
    "wait_for_first_weights",
    "gating_threshold",
    "gating_norm",
    "handback_steps",
    "episode_commit",
    "evaluate_every_episodes",
)


class AssignmentError(ValueError):
    """An assignment the robot computer cannot take (the reason names the field)."""


class Assignment(BaseModel):
    """One run's instructions to one of its robots.

    Attributes:
        run_id: the run the robot's steps belong to.
        tasks: task names the robot runs, in turn (its driver's tasks when empty).
        max_episode_steps: episode length in control steps (> 0).
        hidden: hidden width of the fallback MLP for weights without a policy card (a
            version's card, ``edge_agent.policy_build``, decides the network otherwise).
        seed: episode seed of this robot's first episode in the run (robots of one run get
            different seeds so simulated ones replay different goals); the robot adds the
            number of episodes it already recorded in the run.
        terminate_on_success: end an episode as ``terminated`` when the task succeeds.
        needs_operator: the run's algorithm learns from interventions (HG-DAgger): a robot
            with no operator refuses the assignment.
        demonstrations: task -> demonstration episodes this robot's operator drives before
            its policy episodes (the run's demonstration phase, split among its robots); a
            robot with no operator refuses an assignment with any.
        reward_source: where each step's stored reward comes from (the run spec's
            ``reward.source``, ``edge_agent.rewards``): ``robot`` (the driver's),
            ``labels`` (1 on the verdict step of a success episode) or ``classifier`` (the
            reward classifier shipped beside the policy).
        help: the run's ``help:`` section (``edge_agent.help.HelpSettings`` fields; empty:
            the robot never asks for help).
        edge: the run's edge settings, keys of :data:`RUN_EDGE_FIELDS` only.
        ingest: where this robot uploads its steps in a sharded run: its buffer shard's
            ingest endpoint and a shard ticket (``comms.robot.shard_route.Route`` fields:
            ``address``, ``ticket``, ``shard``, ``expires_at``, ``issued_at``, ``tls``);
            empty: the cloud it is connected to.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str = Field(min_length=1, max_length=128)
    tasks: list[str] = Field(default_factory=list)
    max_episode_steps: int = Field(gt=0)
    hidden: int = Field(default=64, gt=0)
    seed: int = 0
    terminate_on_success: bool = False
    needs_operator: bool = False
    demonstrations: dict[str, int] = Field(default_factory=dict)
    reward_source: Literal["robot", "labels", "classifier"] = "robot"
    help: dict[str, Any] = Field(default_factory=dict)
    edge: dict[str, Any] = Field(default_factory=dict)
    ingest: dict[str, Any] = Field(default_factory=dict)

    @field_validator("demonstrations")
    @classmethod
    def _counts(cls, v: dict[str, int]) -> dict[str, int]:
        bad = {t: n for t, n in v.items() if n < 0}
        if bad:
            raise ValueError(f"demonstration counts must be >= 0, got {bad}")
        return v

    @field_validator("edge")
    @classmethod
    def _run_fields_only(cls, v: dict[str, Any]) -> dict[str, Any]:
        foreign = sorted(set(v) - set(RUN_EDGE_FIELDS))
        if foreign:
            raise ValueError(
                f"edge settings {foreign} are the robot computer's own, not a run's "
                f"(a run sets {list(RUN_EDGE_FIELDS)})"
            )
        return v

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str) -> Assignment:
        """Parse and validate an assignment.

        Raises:
            AssignmentError: not JSON, or a field is missing or invalid (named).
        """
        try:
            return cls.model_validate_json(text)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'assignment'}: {e['msg']}"
                for e in exc.errors()
            )
            raise AssignmentError(f"invalid assignment: {problems}") from None

    def edge_settings(self, own: EdgeSettings) -> EdgeSettings:
        """The robot's own settings with the run's fields applied (validated).

        Raises:
            AssignmentError: a run field has a value EdgeSettings refuses (named).
        """
        try:
            return EdgeSettings.model_validate({**own.model_dump(), **self.edge})
        except ValidationError as exc:
            raise AssignmentError(f"invalid edge settings in the assignment: {exc}") from None


def run_edge_settings(
    edge: EdgeSettings, control_hz: float, evaluate_every: int = 0
) -> dict[str, Any]:
    """The :data:`RUN_EDGE_FIELDS` of ``edge`` (the cloud's fleet-wide defaults) with the run's
    control rate and evaluation schedule (every ``evaluate_every``-th episode a policy-only
    evaluation, 0: none): what the cloud puts in each assignment of a run."""
    fields = {f: getattr(edge, f) for f in RUN_EDGE_FIELDS}
    fields["control_hz"] = control_hz
    fields["evaluate_every_episodes"] = evaluate_every
    return fields
