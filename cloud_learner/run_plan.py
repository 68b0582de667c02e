"""What a run spec means for the learner: its algorithm and policy kind checked against this
learner's registry (:data:`cloud_learner.algorithms.BUILDERS`; the floor's run spec keeps
plain names), its hyper-parameters split between the knobs every run has
(:class:`foundation.runspec.RunParams`) and the algorithm's own (its builder's ``options``),
the learner settings they make, and the run's replay wiring (its builder's sampler and rate
limiter).

``spec.hyperparameters`` is one flat mapping, e.g. ``{"lr": 1e-3, "control_hz": 20,
"gamma": 0.95}``; a key is refused by name when it is unknown, mistyped, out of range or
belongs to another algorithm (:meth:`RunPlan.from_spec`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from buffer.sampling.rate_limiter import RateLimiter
from buffer.sampling.samplers import Sampler
from cloud_learner.algorithms import BUILDERS, AlgorithmBuilder
from cloud_learner.config import LearnerSettings
from foundation.runspec import (
    RunParams,
    RunSpec,
    RunSpecError,
    knob_names,
    parse_knobs,
    parse_run_spec,
)

# The run spec's policy kinds this learner builds (``cloud_learner.policies``).
POLICY_KINDS = (
    "mlp",
    "cnn",
    "gaussian",
    "flow-chunk",
    "lerobot-act",
    "lerobot-diffusion",
    "lerobot-smolvla",
    "lerobot-pi0",
    "lerobot-gaussian-actor",
)
# LeRobot policies whose configs load a pretrained VLM: a run builds them only from a local
# checkpoint directory (``policy.init_checkpoint``), never a hub download.
PRETRAINED_ONLY_KINDS = ("lerobot-smolvla", "lerobot-pi0")
# The run spec's policy kinds -> the learner settings' (cnn is the MLP with a camera encoder).
_LEARNER_KINDS = {
    "mlp": "mlp",
    "cnn": "mlp",
    "gaussian": "gaussian",
    "flow-chunk": "flow",
    "lerobot-gaussian-actor": "lerobot_gaussian",
}
IMAGE_PREFIX = "observation.images."


def name_errors(algorithm: Any, policy_kind: Any) -> dict[str, str]:
    """An algorithm or policy kind this learner does not have, named by field with the known
    ones (empty: both known; an empty kind is the algorithm's own)."""
    errors: dict[str, str] = {}
    if algorithm not in BUILDERS:
        *rest, last = (repr(n) for n in BUILDERS)
        errors["algorithm"] = f"Input should be {', '.join(rest)} or {last}"
    if policy_kind and policy_kind not in POLICY_KINDS:
        errors["policy.kind"] = (
            f"unknown policy kind {policy_kind!r} (known: {', '.join(POLICY_KINDS)})"
        )
    return errors


def resolve(spec: RunSpec) -> RunSpec:
    """``spec`` with its policy kind filled in (its algorithm's own when it names none).

    Raises:
        RunSpecError: an unknown algorithm or policy kind (:func:`name_errors`).
    """
    errors = name_errors(spec.algorithm, spec.policy.kind)
    if errors:
        raise RunSpecError(errors)
    kind = spec.policy.kind or BUILDERS[spec.algorithm].policy_kind
    if spec.help.risk != "none" and kind.startswith("lerobot"):
        # The probe reads a robofleet head's activations; the ensemble copies its versions.
        raise RunSpecError(
            {
                "help.risk": f"{spec.help.risk} needs a robofleet policy (mlp, cnn, gaussian, "
                f"flow-chunk), not {kind}; use help.risk: none"
            }
        )
    if spec.policy.kind:
        return spec
    policy = spec.policy.model_copy(update={"kind": kind})
    return spec.model_copy(update={"policy": policy})


def parse_spec(data: Any) -> RunSpec:
    """A run spec document (a mapping) validated by the floor and against this learner's
    algorithms and policy kinds, every bad field named at once; the policy kind filled in.

    Raises:
        RunSpecError: naming every invalid field.
    """
    try:
        return resolve(parse_run_spec(data))
    except RunSpecError as err:
        errors = dict(err.errors)
    if isinstance(data, dict):
        policy = data.get("policy")
        kind = policy.get("kind") if isinstance(policy, dict) else None
        for key, msg in name_errors(data.get("algorithm"), kind).items():
            errors.setdefault(key, msg)
    raise RunSpecError(errors)


def is_lerobot_dir(path: str | None) -> bool:
    """``path`` is a LeRobot ``pretrained_model`` directory (``config.json`` +
    ``model.safetensors``, as LeRobot's ``save_pretrained`` writes)."""
    if not path:
        return False
    p = Path(path)
    return (p / "config.json").is_file() and (p / "model.safetensors").is_file()


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
        """The plan of ``spec`` (its ``spec``: the policy kind filled in, :func:`resolve`).

        Raises:
            RunSpecError: an unknown algorithm or policy kind; naming every unknown, mistyped
                or foreign hyper-parameter and every policy field the fleet's edge agents
                cannot run.
        """
        spec = resolve(spec)
        builder = BUILDERS[spec.algorithm]
        general, own, errors = _split(spec, builder)
        params, bad = parse_knobs(RunParams, general)
        errors.update(bad)
        options, bad = parse_knobs(builder.options, own)
        errors.update(bad)
        errors.update(_policy_errors(spec, builder))
        if errors or params is None or options is None:
            raise RunSpecError(errors)
        return cls(spec, builder, params, options)

    def cameras(self, observation_features: Mapping[str, Mapping[str, Any]]) -> list[str]:
        """The camera features (``observation.images.<name>``) the policy sees, of the run's
        ``observation_features`` (its robots' shared features, or its buffer's).

        ``policy.cameras`` names them; left out: every camera for ``cnn`` and LeRobot kinds,
        none for the others.

        Raises:
            RunSpecError: a named camera the robots lack; ``cnn`` on robots without cameras;
                cameras of different frame sizes (one encoder serves them all).
        """
        spec = self.spec.policy
        have = sorted(k for k in observation_features if k.startswith(IMAGE_PREFIX))
        if spec.cameras is None:
            wants_all = spec.kind == "cnn" or spec.kind.startswith("lerobot-")
            keys = have if wants_all else []
        else:
            keys = [IMAGE_PREFIX + c for c in spec.cameras]
            missing = [k.removeprefix(IMAGE_PREFIX) for k in keys if k not in have]
            if missing:
                cams = [k.removeprefix(IMAGE_PREFIX) for k in have] or "none"
                raise RunSpecError(
                    {"policy.cameras": f"the robots have no camera {missing} (they have {cams})"}
                )
        if spec.kind == "cnn" and not keys:
            raise RunSpecError(
                {"policy.kind": "cnn sees the robots' cameras and they have none; use mlp"}
            )
        sizes = {k: tuple(observation_features[k]["shape"][:2]) for k in keys}
        if len(set(sizes.values())) > 1:
            raise RunSpecError(
                {
                    "policy.cameras": f"cameras of different frame sizes {sizes}; one encoder "
                    "serves every camera: choose cameras of one size with policy.cameras"
                }
            )
        return keys

    def feature_errors(
        self, observation_features: Mapping[str, Mapping[str, Any]], action_dim: int
    ) -> dict[str, str]:
        """What the policy cannot take of the robots' features, by field or feature name
        (empty: it can). LeRobot's Gaussian actor: its config fields, the normaliser's bounds
        against the state and action sizes, vector state, 3-channel cameras
        (``cloud_learner.policies.lerobot_gaussian.feature_errors``); other kinds: none here.

        Raises:
            RunSpecError: the cameras the spec names do not fit (:meth:`cameras`).
        """
        if self.spec.policy.kind != "lerobot-gaussian-actor":
            return {}
        from cloud_learner.policies.lerobot_gaussian import feature_errors

        cameras = self.cameras(observation_features)
        return feature_errors(self.spec.policy.config, observation_features, cameras, action_dim)

    def learner_settings(
        self, observation_features: Mapping[str, Mapping[str, Any]], action_dim: int
    ) -> LearnerSettings:
        """The learner's settings: one shared policy on state (D from ``observation.state``),
        the cameras it sees (:meth:`cameras`) and the task, acting with A = ``action_dim``.

        Raises:
            RunSpecError: the cameras the spec names do not fit ``observation_features``.
        """
        spec, params = self.spec, self.params
        mixes = self.builder.learner_sampler == "mix"
        state = observation_features.get("observation.state", {}).get("shape", [1])
        cameras = self.cameras(observation_features)
        image_shape = tuple(observation_features[cameras[0]]["shape"][:2]) if cameras else (64, 64)
        return LearnerSettings.model_validate(
            {
                "device": "cpu",
                "algorithm": self.builder.learner_name,
                "algorithm_config": self.builder.algorithm_config(self.options, params, spec),
                "policy": {
                    **self._policy_kind(),
                    "state_dim": int(state[0]) if state else 1,
                    "action_dim": action_dim,
                    "num_tasks": len(spec.tasks),
                    "chunk_size": spec.policy.chunk_size,
                    "image_keys": cameras,
                    "image_shape": image_shape,
                    "hidden": spec.policy.hidden_sizes[0],
                    "depth": len(spec.policy.hidden_sizes),
                    "hidden_sizes": list(spec.policy.hidden_sizes),
                },
                "seed": params.seed,
                "batch_size": params.batch_size,
                "min_transitions": spec.buffer.min_size,
                "publish_every_updates": spec.publish.every_updates or 10**9,
                "publish_every_seconds": spec.publish.every_seconds or 1e9,
                "checkpoint_every_updates": params.checkpoint_every_updates,
                "log_every_updates": 10,
                "tasks": list(spec.tasks),
                "sampler": self.builder.learner_sampler,
                # Only the mix sampler reads it; the others keep the settings' default.
                "online_fraction": spec.buffer.online_fraction if mixes else 0.5,
                "torch_threads": 1,
            }
        )

    def _policy_kind(self) -> dict[str, Any]:
        """The learner settings' policy kind fields for the spec's ``policy.kind``."""
        p = self.spec.policy
        if p.kind == "lerobot-gaussian-actor":  # LeRobot's HIL-SERL actor: fields and bounds
            return {"kind": _LEARNER_KINDS[p.kind], "lerobot_config": dict(p.config)}
        if p.kind.startswith("lerobot-"):
            lerobot = p.kind.removeprefix("lerobot-")
            config = dict(p.config)
            if p.chunk_size > 1 and lerobot == "diffusion":  # the chunk the robots execute
                config["n_action_steps"] = p.chunk_size
            elif p.chunk_size > 1:  # ACT, SmolVLA, pi0: the chunk it predicts and robots run
                config.update(chunk_size=p.chunk_size, n_action_steps=p.chunk_size)
            return {
                "kind": "lerobot",
                "lerobot_kind": lerobot,
                "lerobot_config": config,
                "pretrained_path": p.init_checkpoint if is_lerobot_dir(p.init_checkpoint) else None,
            }
        return {"kind": _LEARNER_KINDS[p.kind]}

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

    def batch_layout(self, images: list[str] | None = None, chunk: int = 1) -> dict[str, Any]:
        """What each row of the learner's batches carries (``buffer.service.batches``'s request
        ``layout``): ``{"images": [...], "chunk": T, "next_images": bool}``: the cameras the
        policy sees, the action chunk it trains on (T > 1: ``action_chunk``) and whether the
        algorithm needs the next observation's frames (SAC's critics)."""
        return {
            "images": list(images or []),
            "chunk": chunk,
            "next_images": self.builder.needs_next_observation and bool(images),
        }

    @property
    def reward_scale(self) -> float:
        """Multiplies every batch's ``reward`` on the learner's side (the algorithm's)."""
        return self.builder.reward_scale(self.options)

    def sampler(self, offline: bool, shares: Mapping[str, float]) -> Sampler | None:
        """The sampler of the run's batch service (the builder's; see
        :meth:`cloud_learner.algorithms.AlgorithmBuilder.sampler`)."""
        return self.builder.sampler(self.options, self.spec, offline, shares)

    def rate_limiter(self) -> RateLimiter | None:
        """The run's samples-per-insert rate limiter (the builder's), sampling side only."""
        return self.builder.rate_limiter(self.options, self.spec)

    @property
    def terminate_on_success(self) -> bool:
        """Robots end an episode at success (the algorithm's episode rule)."""
        return self.builder.terminate_on_success

    @property
    def needs_operator(self) -> bool:
        """Every robot of the run must have an operator (the algorithm learns from them)."""
        return self.builder.needs_operator

    @property
    def learns_from(self) -> str:
        """``reward``, ``success`` or ``interventions``: what the algorithm's update learns
        from (its builder's ``learns_from``)."""
        return self.builder.learns_from


def _split(
    spec: RunSpec, builder: AlgorithmBuilder
) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """``spec.hyperparameters`` as (the run's knobs, the algorithm's own, errors)."""
    general_names = knob_names(RunParams)
    own_names = knob_names(builder.options)
    owners: dict[str, list[str]] = {}
    for b in BUILDERS.values():
        for n in knob_names(b.options):
            owners.setdefault(n, []).append(repr(b.name))
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
                f"applies to algorithm {' or '.join(owners[key])} only, not {spec.algorithm!r}"
            )
        else:
            errors[f"hyperparameters.{key}"] = (
                f"unknown hyper-parameter (known: {', '.join(known)})"
            )
    return general, own, errors


def _policy_errors(spec: RunSpec, builder: AlgorithmBuilder) -> dict[str, str]:
    """What the algorithm cannot train of ``spec.policy`` (each named by field)."""
    errors: dict[str, str] = {}
    p = spec.policy
    if p.kind not in builder.policy_kinds:
        errors["policy.kind"] = (
            f"algorithm {spec.algorithm!r} trains {list(builder.policy_kinds)}; got {p.kind!r}"
        )
    elif p.kind in PRETRAINED_ONLY_KINDS and not is_lerobot_dir(p.init_checkpoint):
        errors["policy.init_checkpoint"] = (
            f"{p.kind} is built from a local LeRobot pretrained_model directory (config.json "
            "and model.safetensors, saved by LeRobot's save_pretrained): set "
            "policy.init_checkpoint to one; nothing is downloaded"
        )
    if p.kind == "lerobot-gaussian-actor":
        errors.update(_lerobot_gaussian_errors(p.config, p.chunk_size))
        for key in ("init_checkpoint", "init_from_run"):
            if getattr(p, key) is not None:
                errors[f"policy.{key}"] = (
                    "lerobot-gaussian-actor starts from LeRobot's initialisation; starting "
                    "weights are not supported for it"
                )
    if p.kind == "gaussian" and p.chunk_size != 1:
        errors["policy.chunk_size"] = (
            f"SAC's Gaussian actor acts one step at a time; got {p.chunk_size}"
        )
    if p.config and not p.kind.startswith("lerobot-"):
        errors["policy.config"] = f"LeRobot config fields apply to lerobot-* kinds, not {p.kind!r}"
    if p.kind == "lerobot-act" and "chunk_size" in p.config:
        errors["policy.config"] = "set ACT's chunk with policy.chunk_size, not policy.config"
    return errors


def _lerobot_gaussian_errors(config: Mapping[str, Any], chunk_size: int) -> dict[str, str]:
    """What LeRobot's Gaussian actor refuses of the spec alone (the features are checked
    against the robots' at launch, :meth:`RunPlan.feature_errors`)."""
    from cloud_learner.policies.lerobot_gaussian import BOUND_FIELDS, config_field_names

    errors: dict[str, str] = {}
    if chunk_size != 1:
        errors["policy.chunk_size"] = (
            f"LeRobot's Gaussian actor acts one step at a time; got {chunk_size}"
        )
    known = config_field_names()
    for key in sorted(set(config) - known - set(BOUND_FIELDS)):
        errors[f"policy.config.{key}"] = (
            f"not a field of LeRobot's GaussianActorConfig nor a bound ({', '.join(BOUND_FIELDS)})"
        )
    return errors


__all__ = ["POLICY_KINDS", "RunPlan", "parse_spec", "resolve"]
