"""What a run spec means for the processes of a run: learner settings, robot options, cadences.

The run spec (:mod:`robofleet.runspec`) says *what* to train; this module turns it into the
settings each part takes. Knobs that the spec leaves open come from ``spec.hyperparameters``
(defaults in :class:`RunParams`), e.g. ``{"lr": 1e-3, "control_hz": 20}``.

The simulated Meta-World fleet runs three algorithms (``spec.algorithm``); for each, the
policy kind it trains, how its batches are drawn from the run's buffer, and how robots end
episodes:

* ``hg-dagger``: ``mlp``; operator-labelled steps only; fixed-length episodes.
* ``recap``: ``mlp`` (indicator-conditioned); every step uniformly; episodes end
  (``terminated``) at success.
* ``sac``: ``gaussian``; RLPD's symmetric sampling, ``buffer.online_fraction`` (0.5) of each
  batch from autonomous steps and the rest from operator steps (demonstrations and
  takeovers); fixed-length episodes (truncation is not termination). Its online updates
  keep the behaviour-cloned start: ``critic_warmup_updates`` critic-only updates first, a
  small ``init_temperature``, and a TD3+BC term (``bc_weight``) on operator rows. Measured
  with ``robofleet demo --algorithm sac --robots 2 --minutes 3``: without them the policy's
  own success fell from 0.35 to 0.00 at the first evaluation and ended at 0.25 with 1.00 of
  steps intervened; with them it went 0.25 -> 0.55 (0.40-0.75 along the run) at 0.94.

Rewards: Meta-World's dense shaped reward lies in [0, 10] per step (10 at the goal); SAC
trains on it times ``reward_scale`` (default 0.1, so [0, 1]). RECAP ignores it and uses
pi*0.6's sparse return (-1 per step, a failure penalty of ``max_episode_steps`` when an
episode ends without success), scaled by ``1 / (2 * max_episode_steps)`` into [-1, 0].
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from cloud_learner.config import LearnerSettings
from robofleet.runspec import RunSpec, RunSpecError

STATE_DIM = 39  # Meta-World's goal-observable state (hal.drivers.metaworld)
ACTION_DIM = 4

_ALGORITHMS = {"hg-dagger": "hg_dagger", "recap": "recap", "sac": "sac_rlpd"}
DISPLAY_NAMES = {"hg-dagger": "HG-DAgger", "recap": "RECAP", "sac": "SAC/RLPD"}
# The policy class each algorithm trains (cloud_learner.policies; edge agents build the same
# from the weights' policy card).
POLICY_KINDS = {"hg-dagger": "mlp", "recap": "mlp", "sac": "gaussian"}
# Hyper-parameters that mean something to one algorithm only.
_ONLY_FOR = {
    "guidance_weight": "recap",
    "positive_fraction": "recap",
    "indicator_dropout": "recap",
    "gamma": "sac",
    "reward_scale": "sac",
    "init_temperature": "sac",
    "target_entropy": "sac",
    "critic_warmup_updates": "sac",
    "bc_weight": "sac",
}
_ZERO_OK = (
    "updates_per_s",
    "seed",
    "bc_updates",
    "indicator_dropout",
    "critic_warmup_updates",
    "bc_weight",
)
# Any real number (an entropy in nats may be negative).
_SIGNED = ("target_entropy",)
_RANGES: dict[str, tuple[Callable[[float], bool], str]] = {
    "positive_fraction": (lambda v: 0 < v < 1, "(0, 1)"),
    "indicator_dropout": (lambda v: 0 <= v < 1, "[0, 1)"),
    "gamma": (lambda v: 0 < v <= 1, "(0, 1]"),
}


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
        guidance_weight: RECAP only; classifier-free guidance weight w of the robots'
            "positive"-conditioned actions (1 = plain conditioning).
        positive_fraction: RECAP only; share of each task's data labelled an improvement.
        indicator_dropout: RECAP only; probability of training the unconditional branch.
        gamma: SAC only; discount per control step.
        reward_scale: SAC only; multiplies Meta-World's dense reward (0..10 per step).
        init_temperature: SAC only; initial entropy temperature alpha. 0.01: with rewards
            in [0, 1] per step, alpha = 0.1 would pay an entropy bonus (about 0.1 * 4 nats
            per step) as large as the task's reward, and widen the cloned actor.
        target_entropy: SAC only; the temperature's target entropy in nats (SAC's -A = -4
            heuristic). The cloned actor starts near -2, so alpha falls and stops widening it.
        critic_warmup_updates: SAC only; first online updates that train the critics alone
            (actor and alpha frozen): RLPD's critics start untrained, and an actor that
            follows them at once forgets the warm start (offline-to-online practice).
        bc_weight: SAC only; weight of TD3+BC's behaviour term on operator rows against the
            Q term normalised by ``mean |Q|`` (Fujimoto & Gu 2021, whose alpha = 2.5 would be
            0.4; our term is in pre-squash units, larger, and 1.0 held the clone better in
            tests/cloud_learner/test_sac_warm_start.py); 0 = plain SAC.
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
    guidance_weight: float = 1.0
    positive_fraction: float = 0.3
    indicator_dropout: float = 0.3
    gamma: float = 0.99
    reward_scale: float = 0.1
    init_temperature: float = 0.01
    target_entropy: float = -float(ACTION_DIM)
    critic_warmup_updates: int = 400
    bc_weight: float = 1.0

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
            if key not in _SIGNED and (value < 0 or (value == 0 and key not in _ZERO_OK)):
                errors[f"hyperparameters.{key}"] = f"must be positive, got {value!r}"
                continue
            bounds = _RANGES.get(key)
            if bounds is not None and not bounds[0](value):
                errors[f"hyperparameters.{key}"] = f"must be in {bounds[1]}, got {value!r}"
                continue
            owner = _ONLY_FOR.get(key)
            if owner is not None and owner != spec.algorithm:
                errors[f"hyperparameters.{key}"] = (
                    f"applies to algorithm {owner!r} only, not {spec.algorithm!r}"
                )
                continue
            values[key] = want(value)
        errors.update(_policy_errors(spec))
        if errors:
            raise RunSpecError(errors)
        return cls(**values)


def _policy_errors(spec: RunSpec) -> dict[str, str]:
    """What the simulated fleet cannot run of ``spec.algorithm`` / ``spec.policy``."""
    errors: dict[str, str] = {}
    want = POLICY_KINDS.get(spec.algorithm)
    if want is None:
        errors["algorithm"] = (
            f"the run manager drives {sorted(POLICY_KINDS)}; got {spec.algorithm!r}"
        )
    elif spec.policy.kind != want:
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


def learner_settings(spec: RunSpec, params: RunParams) -> LearnerSettings:
    """The learner's settings for ``spec``: one shared policy on state + task one-hot."""
    config: dict[str, Any] = {"lr": params.lr}
    sampler, online_fraction = "intervention", 0.5
    if spec.algorithm == "recap":
        horizon = params.max_episode_steps
        config.update(
            value_lr=params.lr,
            guidance_weight=params.guidance_weight,
            positive_fraction=params.positive_fraction,
            indicator_dropout=params.indicator_dropout,
            failure_penalty=float(horizon),
            return_scale=1.0 / (2.0 * horizon),
        )
        sampler = "uniform"
    elif spec.algorithm == "sac":
        config.update(
            gamma=params.gamma,
            hidden=spec.policy.hidden_sizes[0],
            init_temperature=params.init_temperature,
            target_entropy=params.target_entropy,
            critic_warmup_updates=params.critic_warmup_updates,
            bc_weight=params.bc_weight,
        )
        sampler, online_fraction = "mix", spec.buffer.online_fraction
    return LearnerSettings.model_validate(
        {
            "device": "cpu",
            "algorithm": _ALGORITHMS[spec.algorithm],
            "algorithm_config": config,
            "policy": {
                "kind": POLICY_KINDS[spec.algorithm],
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
            "sampler": sampler,
            "online_fraction": online_fraction,
            "torch_threads": 1,
        }
    )


def batch_sampling(spec: RunSpec, params: RunParams) -> dict[str, Any]:
    """How the learner asks the :class:`~buffer.service.BatchServer` to draw
    its batches and shape rewards (see the table in the module docstring)."""
    if spec.algorithm == "recap":
        return {"kind": "uniform", "reward_scale": 1.0}
    if spec.algorithm == "sac":
        return {
            "kind": "symmetric",
            "online_fraction": spec.buffer.online_fraction,
            "reward_scale": params.reward_scale,
        }
    return {"kind": "intervention", "reward_scale": 1.0}


def agent_options(spec: RunSpec) -> dict[str, Any]:
    """Extra ``edge_agent.build.AgentOptions`` fields for the robots of ``spec``'s run."""
    return {"terminate_on_success": spec.algorithm == "recap"}
