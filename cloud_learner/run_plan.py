"""What a run spec means for the learner: its hyper-parameters split between the knobs every
run has (:class:`robofleet.runspec.RunParams`) and the algorithm's own (its builder's
``options``), the learner settings they make, and how the learner's batches are drawn.

``spec.hyperparameters`` is one flat mapping, e.g. ``{"lr": 1e-3, "control_hz": 20,
"gamma": 0.95}``; a key is refused by name when it is unknown, mistyped, out of range or
belongs to another algorithm (:meth:`RunPlan.from_spec`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cloud_learner.algorithms import BUILDERS, AlgorithmBuilder
from cloud_learner.config import LearnerSettings
from robofleet.runspec import RunParams, RunSpec, RunSpecError, knob_names, parse_knobs

# The buffer service's sampling kind -> the learner settings' sampler of the same rows.
_SAMPLERS = {"intervention": "intervention", "uniform": "uniform", "symmetric": "mix"}


@dataclass(frozen=True)
class RunPlan:
    """A run spec resolved for the learner and the robots.

    Attributes:
        spec: the run spec.
        builder: its algorithm (``cloud_learner.algorithms.BUILDERS``).
        params: the knobs every run has.
        options: the algorithm's own hyper-parameters (its builder's ``options`` dataclass).
    """

    spec: RunSpec
    builder: AlgorithmBuilder
    params: RunParams
    options: Any

    @classmethod
    def from_spec(cls, spec: RunSpec) -> RunPlan:
        """Raises RunSpecError naming every unknown, mistyped or foreign hyper-parameter and
        every policy field the fleet's edge agents cannot run."""
        builder = BUILDERS.get(spec.algorithm)
        if builder is None:
            raise RunSpecError(
                {"algorithm": f"the run manager drives {sorted(BUILDERS)}; got {spec.algorithm!r}"}
            )
        general, own, errors = _split(spec, builder)
        params, bad = parse_knobs(RunParams, general)
        errors.update(bad)
        options, bad = parse_knobs(builder.options, own)
        errors.update(bad)
        errors.update(_policy_errors(spec, builder))
        if errors or params is None or options is None:
            raise RunSpecError(errors)
        return cls(spec, builder, params, options)

    def learner_settings(self, state_dim: int, action_dim: int) -> LearnerSettings:
        """The learner's settings: one shared policy on state (D = ``state_dim``) + task
        one-hot, acting with A = ``action_dim``."""
        spec, params = self.spec, self.params
        sampling = self.builder.sampling(self.options, spec)
        return LearnerSettings.model_validate(
            {
                "device": "cpu",
                "algorithm": self.builder.learner_name,
                "algorithm_config": self.builder.algorithm_config(self.options, params, spec),
                "policy": {
                    "kind": self.builder.policy_kind,
                    "state_dim": state_dim,
                    "action_dim": action_dim,
                    "num_tasks": len(spec.tasks),
                    "hidden": spec.policy.hidden_sizes[0],
                    "depth": len(spec.policy.hidden_sizes),
                },
                "seed": params.seed,
                "batch_size": params.batch_size,
                "min_transitions": spec.buffer.min_size,
                "publish_every_updates": spec.publish.every_updates or 10**9,
                "publish_every_seconds": spec.publish.every_seconds or 1e9,
                "checkpoint_every_updates": params.checkpoint_every_updates,
                "log_every_updates": 10,
                "tasks": list(spec.tasks),
                "sampler": _SAMPLERS[sampling["kind"]],
                "online_fraction": sampling.get("online_fraction", 0.5),
                "torch_threads": 1,
            }
        )

    def model_spec(self) -> dict[str, Any]:
        """The spec's fields the learner's model config (``cloud_learner.factory.model_config``
        of :meth:`learner_settings`) is made from, under their spec keys: the learner keeps
        them with each checkpoint, so a resume it refuses names the spec's key behind a
        difference (``policy.hidden_sizes``, not the learner's ``policy.hidden``)."""
        spec = self.spec
        return {
            "algorithm": spec.algorithm,
            "tasks": list(spec.tasks),
            "policy": spec.policy.model_dump(mode="json"),
            "hyperparameters": dict(spec.hyperparameters),
        }

    def batch_sampling(self) -> dict[str, Any]:
        """How the learner asks the run's buffer service for batches, with the reward scale
        it applies to them: ``{"kind": ..., "reward_scale": ...}``."""
        return {
            **self.builder.sampling(self.options, self.spec),
            "reward_scale": self.builder.reward_scale(self.options),
        }

    @property
    def terminate_on_success(self) -> bool:
        """Robots end an episode at success (the algorithm's episode rule)."""
        return self.builder.terminate_on_success

    @property
    def needs_operator(self) -> bool:
        """Every robot of the run must have an operator (the algorithm learns from them)."""
        return self.builder.needs_operator


def _split(
    spec: RunSpec, builder: AlgorithmBuilder
) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """``spec.hyperparameters`` as (the run's knobs, the algorithm's own, errors)."""
    general_names = knob_names(RunParams)
    own_names = knob_names(builder.options)
    owners = {n: b.name for b in BUILDERS.values() for n in knob_names(b.options)}
    known = sorted(general_names | set(owners))
    general: dict[str, Any] = {}
    own: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for key, value in spec.hyperparameters.items():
        if key in general_names:
            general[key] = value
        elif key in own_names:
            own[key] = value
        elif key in owners:
            errors[f"hyperparameters.{key}"] = (
                f"applies to algorithm {owners[key]!r} only, not {spec.algorithm!r}"
            )
        else:
            errors[f"hyperparameters.{key}"] = (
                f"unknown hyper-parameter (known: {', '.join(known)})"
            )
    return general, own, errors


def _policy_errors(spec: RunSpec, builder: AlgorithmBuilder) -> dict[str, str]:
    """What the fleet's edge agents cannot run of ``spec.policy`` (``edge_agent.policy_build``
    builds the policy card's kinds with two equal hidden layers, one action per step)."""
    errors: dict[str, str] = {}
    want = builder.policy_kind
    if spec.policy.kind != want:
        errors["policy.kind"] = (
            f"algorithm {spec.algorithm!r} trains a {want!r} policy on the simulated fleet; "
            f"got {spec.policy.kind!r}"
        )
    hidden = spec.policy.hidden_sizes
    if len(hidden) != 2 or hidden[0] != hidden[1]:
        errors["policy.hidden_sizes"] = (
            "edge agents run two equal hidden layers, e.g. [128, 128]; got " + str(hidden)
        )
    if spec.policy.chunk_size != 1:
        errors["policy.chunk_size"] = (
            f"the simulated fleet's policies act one step at a time (1); got "
            f"{spec.policy.chunk_size}"
        )
    return errors


__all__ = ["RunPlan"]
