"""What a run needs to know of an algorithm, owned by the algorithm (Acme's builders are the
model): its own hyper-parameters, the learner config it makes of them, how its batches are
drawn from the run's buffer and how robots end its episodes. (Its warm start is the
algorithm's own ``bc_update``.)

Each algorithm module ends with its builder; :data:`cloud_learner.algorithms.BUILDERS` lists
them by the run spec's algorithm name. ``cloud_learner.run_settings`` turns a run spec into
learner settings through them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from foundation.runspec import DEFAULT_POLICY_KIND, RunParams, RunSpec


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
        policy_kinds: the run spec's ``policy.kind`` values it trains.
        needs_next_observation: its update reads ``next.observation.*`` (a critic's target).
    """

    name: ClassVar[str]
    learner_name: ClassVar[str]
    display_name: ClassVar[str]
    options: ClassVar[type] = NoOptions
    terminate_on_success: ClassVar[bool] = False
    indicator: ClassVar[bool] = False  # its policy is conditioned on an improvement indicator
    needs_operator: ClassVar[bool] = False
    policy_kinds: ClassVar[tuple[str, ...]] = ("mlp", "cnn")
    needs_next_observation: ClassVar[bool] = False

    @property
    def policy_kind(self) -> str:
        """The policy class it trains (``cloud_learner.policies``), as the run spec defaults it."""
        return DEFAULT_POLICY_KIND[self.name]

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
    def sampling(self, options: Any, spec: RunSpec) -> dict[str, Any]:
        """How the learner asks the run's buffer service for batches (``buffer.service``):
        ``{"kind": "intervention" | "uniform" | "symmetric", ...}``."""

    def reward_scale(self, options: Any) -> float:
        """Multiplies every batch's ``reward`` (1: the robots' reward as stored)."""
        return 1.0
