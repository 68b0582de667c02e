"""What a run needs to know of an algorithm, owned by the algorithm (Acme's builders are the
model): its own hyper-parameters, the learner config it makes of them, its replay wiring (the
sampler the run's batch service draws with, the samples-per-insert rate limiter) and how
robots end its episodes. (Its warm start is the algorithm's own ``bc_update``.)

Each algorithm module ends with its builder; :data:`cloud_learner.algorithms.BUILDERS` lists
them by the run spec's algorithm name. :class:`cloud_learner.run_plan.RunPlan` turns a run
spec into learner settings through them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from buffer.sampling.rate_limiter import RateLimiter
from buffer.sampling.samplers import Sampler
from foundation.runspec import RunParams, RunSpec


@dataclass(frozen=True)
class NoOptions:
    """An algorithm without hyper-parameters of its own."""


class AlgorithmBuilder(ABC):
    """One algorithm as a run uses it.

    Class attributes:
        name: the run spec's ``algorithm`` (``hg-dagger``).
        learner_name: the learner settings', checkpoints' and policy cards' name
            (``hg_dagger``).
        display_name: for people (``HG-DAgger``).
        options: a dataclass of :func:`foundation.runspec.knob` fields, the hyper-parameters
            this algorithm alone owns in ``spec.hyperparameters``.
        terminate_on_success: robots end an episode (``terminated``) when the task is solved;
            otherwise episodes run their full length (truncation is not termination).
        indicator: its policy takes RECAP's improvement indicator as an input.
        needs_operator: it learns from human interventions (HG-DAgger): every robot of its
            runs must have an operator (keyboard, gamepad, the scripted expert).
        learns_from: the signal its update learns from: ``reward`` (the stored reward of
            every step: SAC), ``success`` (each episode's outcome: RECAP's sparse return) or
            ``interventions`` (the operators' actions: HG-DAgger). Launch refuses
            ``reward.source: robot`` on robots that give no such signal
            (``runs.manager.validate_launch``).
        policy_kinds: the run spec's ``policy.kind`` values it trains.
        default_policy_kind: the one a run spec that names none trains.
        needs_next_observation: its update reads ``next.observation.*`` (a critic's target).
        learner_sampler: the learner settings' ``sampler`` that draws the rows
            :meth:`sampler` draws (``cloud_learner.config.LearnerSettings``).
    """

    name: ClassVar[str]
    learner_name: ClassVar[str]
    display_name: ClassVar[str]
    options: ClassVar[type] = NoOptions
    terminate_on_success: ClassVar[bool] = False
    indicator: ClassVar[bool] = False  # its policy is conditioned on an improvement indicator
    needs_operator: ClassVar[bool] = False
    learns_from: ClassVar[Literal["reward", "success", "interventions"]] = "reward"
    policy_kinds: ClassVar[tuple[str, ...]] = ("mlp", "cnn")
    default_policy_kind: ClassVar[str] = "mlp"
    needs_next_observation: ClassVar[bool] = False
    learner_sampler: ClassVar[str] = "uniform"

    @property
    def policy_kind(self) -> str:
        """The policy class it trains (``cloud_learner.policies``), as the run spec defaults it."""
        return self.default_policy_kind

    @abstractmethod
    def build(self, policy: Any, config: dict[str, Any]) -> Any:
        """The algorithm around ``policy`` with ``config`` (its config dataclass's fields).

        Raises:
            TypeError: an unknown field of its config.
        """

    @abstractmethod
    def algorithm_config(self, options: Any, run: RunParams, spec: RunSpec) -> dict[str, Any]:
        """Keyword arguments of the algorithm's config dataclass (``learner.algorithm_config``;
        a checkpoint resumes only under the same ones)."""

    @abstractmethod
    def sampler(
        self, options: Any, spec: RunSpec, offline: bool, shares: Mapping[str, float]
    ) -> Sampler | None:
        """The sampler the run's batch service draws this algorithm's batches with (None:
        every eligible row alike), asked once when the run builds its buffer's service.

        Args:
            offline: offline data is mounted into the run's buffer.
            shares: the per-task online shares the service keeps up to date (SOP's adaptive
                mix, ``buffer.mix: adaptive``); fixed runs use ``buffer.online_fraction``.
        """

    def rate_limiter(self, options: Any, spec: RunSpec) -> RateLimiter | None:
        """The sampling side of Reverb's samples-per-insert rule at ``buffer.samples_per_insert``
        (None: unlimited). Robots are never blocked: the learner waits for data."""
        spi = spec.buffer.samples_per_insert
        return RateLimiter.sampling_side(spi) if spi is not None else None

    def reward_scale(self, options: Any) -> float:
        """Multiplies every batch's ``reward`` (1: the robots' reward as stored)."""
        return 1.0


def online_share(spec: RunSpec, offline: bool, shares: Mapping[str, float]) -> Any:
    """A mixing sampler's online share: the live per-task ``shares`` under SOP's adaptive mix
    with offline data mounted, else ``buffer.online_fraction`` for every task."""
    adaptive = offline and spec.buffer.mix == "adaptive"
    return shares if adaptive else spec.buffer.online_fraction
