"""What a run spec means for the processes of a run: learner settings, robot options, cadences.

The run spec (:mod:`robofleet.runspec`) says *what* to train; this module turns it into the
settings each part takes. HG-DAgger knobs that the spec leaves open come from
``spec.hyperparameters`` (defaults below), e.g. ``{"lr": 1e-3, "control_hz": 20}``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from cloud_learner.config import LearnerSettings
from robofleet.runspec import RunSpec, RunSpecError

STATE_DIM = 39  # Meta-World's goal-observable state (hal.drivers.metaworld)
ACTION_DIM = 4

_ALGORITHMS = {"hg-dagger": "hg_dagger", "recap": "recap", "sac": "sac_rlpd"}


@dataclass(frozen=True)
class RunParams:
    """Knobs of one run with their defaults (``spec.hyperparameters`` overrides by name).

    Attributes:
        lr: learning rate of the policy's optimizer.
        batch_size: rows per update.
        bc_updates: behaviour-cloning updates on the demonstrations before any robot moves
            (the weak initial policy).
        demos_per_task: scripted-expert demonstrations per task for that initial policy.
        updates_per_s: upper bound on learner updates per second (0 = unbounded); keeps the
            learner from starving real-time robots on small machines.
        checkpoint_every_updates: learner checkpoint cadence.
        control_hz: robots' control rate (Hz).
        max_episode_steps: training episode length (steps).
        eval_max_steps: evaluation episode limit (steps).
        min_state_std: floor of the state normalisation's standard deviation.
        seed: learner seed.
    """

    lr: float = 1e-3
    batch_size: int = 128
    bc_updates: int = 300
    demos_per_task: int = 1
    updates_per_s: float = 40.0
    checkpoint_every_updates: int = 200
    control_hz: float = 20.0
    max_episode_steps: int = 100
    eval_max_steps: int = 100
    min_state_std: float = 0.05
    seed: int = 0

    @classmethod
    def from_spec(cls, spec: RunSpec) -> RunParams:
        """Raises RunSpecError naming an unknown or mistyped hyper-parameter."""
        known = {f.name: f for f in fields(cls)}
        errors: dict[str, str] = {}
        values: dict[str, Any] = {}
        for key, value in spec.hyperparameters.items():
            f = known.get(key)
            if f is None:
                errors[f"hyperparameters.{key}"] = (
                    f"unknown hyper-parameter (known: {', '.join(sorted(known))})"
                )
                continue
            want = int if f.type == "int" else float
            if isinstance(value, bool) or not isinstance(value, int | float):
                errors[f"hyperparameters.{key}"] = f"must be a number, got {value!r}"
                continue
            if want is int and not float(value).is_integer():
                errors[f"hyperparameters.{key}"] = f"must be an integer, got {value!r}"
                continue
            if value < 0 or (value == 0 and key not in ("updates_per_s", "seed", "bc_updates")):
                errors[f"hyperparameters.{key}"] = f"must be positive, got {value!r}"
                continue
            values[key] = want(value)
        hidden = spec.policy.hidden_sizes
        if spec.policy.kind != "mlp":
            errors["policy.kind"] = "the simulated fleet runs 'mlp' policies only for now"
        if len(hidden) != 2 or hidden[0] != hidden[1]:
            errors["policy.hidden_sizes"] = (
                "edge agents run two equal hidden layers, e.g. [128, 128]; got " + str(hidden)
            )
        if spec.algorithm != "hg-dagger":
            errors["algorithm"] = "the run manager drives 'hg-dagger' runs for now"
        if errors:
            raise RunSpecError(errors)
        return cls(**values)


def learner_settings(spec: RunSpec, params: RunParams) -> LearnerSettings:
    """The learner's settings for ``spec`` (shared MLP on state + task one-hot)."""
    return LearnerSettings.model_validate(
        {
            "device": "cpu",
            "algorithm": _ALGORITHMS[spec.algorithm],
            "algorithm_config": {"lr": params.lr},
            "policy": {
                "kind": "mlp",
                "state_dim": STATE_DIM,
                "action_dim": ACTION_DIM,
                "num_tasks": len(spec.tasks),
                "hidden": spec.policy.hidden_sizes[0],
                "depth": len(spec.policy.hidden_sizes),
            },
            "seed": params.seed,
            "batch_size": params.batch_size,
            "min_transitions": 1,
            "publish_every_updates": spec.publish.every_updates or 10**9,
            "publish_every_seconds": spec.publish.every_seconds or 1e9,
            "checkpoint_every_updates": params.checkpoint_every_updates,
            "log_every_updates": 10,
            "tasks": list(spec.tasks),
            "sampler": "intervention",
            "torch_threads": 1,
        }
    )
