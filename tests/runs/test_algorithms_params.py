"""Run specs for RECAP and SAC/RLPD: what the run manager accepts, refuses (naming the field)
and what it hands the learner, the batch server and the robots."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from buffer.sampling.samplers import InterventionSampler, MixSampler
from cloud_learner.algorithms import RECAP, SACRLPD, HGDAgger
from cloud_learner.factory import build_algorithm
from cloud_learner.policies.gaussian import GaussianPolicy
from cloud_learner.run_plan import RunPlan
from foundation.runspec import RunSpec, RunSpecError, parse_run_spec
from robofleet.commands.demo import build_parser, demo_spec

KINDS = {"hg-dagger": "mlp", "recap": "mlp", "sac": "gaussian"}
STATE_39 = {"observation.state": {"dtype": "float32", "shape": [39]}}


def spec_for(algorithm: str, kind: str | None = None, **extra: Any) -> RunSpec:
    raw: dict[str, Any] = {
        "version": 1,
        "algorithm": algorithm,
        "tasks": ["reach-v3", "push-v3"],
        "policy": {"kind": kind or KINDS[algorithm], "hidden_sizes": [32, 32]},
        "robots": {"robot_type": "metaworld-sawyer", "count": 1},
    }
    for key, value in extra.items():
        raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) else value
    return parse_run_spec(raw)


def refusal(spec: RunSpec) -> dict[str, str]:
    with pytest.raises(RunSpecError) as info:
        RunPlan.from_spec(spec)
    errors: dict[str, str] = info.value.errors
    return errors


def test_sac_with_a_non_gaussian_policy_is_refused_naming_the_field() -> None:
    errors = refusal(spec_for("sac", kind="mlp"))
    assert set(errors) == {"policy.kind"}
    assert "'gaussian'" in errors["policy.kind"] and "'mlp'" in errors["policy.kind"]


@pytest.mark.parametrize("algorithm", ["hg-dagger", "recap"])
def test_regression_algorithms_refuse_a_gaussian_policy(algorithm: str) -> None:
    errors = refusal(spec_for(algorithm, kind="gaussian"))
    assert set(errors) == {"policy.kind"}
    assert "'mlp'" in errors["policy.kind"]


def test_hyperparameters_of_another_algorithm_are_refused_by_name() -> None:
    errors = refusal(spec_for("sac", hyperparameters={"guidance_weight": 2.0, "reward_scale": 0.5}))
    assert set(errors) == {"hyperparameters.guidance_weight"}
    assert "'recap'" in errors["hyperparameters.guidance_weight"]
    errors = refusal(spec_for("hg-dagger", hyperparameters={"gamma": 0.9}))
    assert set(errors) == {"hyperparameters.gamma"}


@pytest.mark.parametrize(
    ("key", "value"),
    [("positive_fraction", 1.0), ("positive_fraction", 0.0), ("indicator_dropout", 1.0)],
)
def test_recap_fractions_out_of_range_are_refused(key: str, value: float) -> None:
    errors = refusal(spec_for("recap", hyperparameters={key: value}))
    assert set(errors) == {f"hyperparameters.{key}"}
    assert f"got {value!r}" in errors[f"hyperparameters.{key}"]


def test_every_bad_field_is_named_at_once() -> None:
    errors = refusal(
        spec_for(
            "sac",
            kind="flow-chunk",
            hyperparameters={"gamma": 1.5},
            policy={"chunk_size": 4, "hidden_sizes": [32, 64], "config": {"dim_model": 64}},
        )
    )
    assert set(errors) == {"policy.kind", "policy.config", "hyperparameters.gamma"}


def test_recap_settings_build_an_indicator_policy_and_sparse_returns_fit_the_horizon() -> None:
    spec = spec_for(
        "recap",
        hyperparameters={"guidance_weight": 1.5, "indicator_dropout": 0, "max_episode_steps": 80},
    )
    plan = RunPlan.from_spec(spec)
    settings = plan.learner_settings(STATE_39, 4)
    algorithm = build_algorithm(settings, torch.device("cpu"))
    assert isinstance(algorithm, RECAP)
    assert algorithm.policy.spec.indicator and algorithm.policy.spec.num_tasks == 2
    assert algorithm.policy.guidance_weight == 1.5
    assert algorithm.config.indicator_dropout == 0.0
    # -1 per step and a failure penalty of one horizon, scaled into [-1, 0].
    assert algorithm.config.failure_penalty == 80.0
    assert algorithm.config.return_scale == pytest.approx(1 / 160)
    assert plan.batch_layout() == {"images": [], "chunk": 1, "next_images": False}
    assert plan.reward_scale == 1.0
    assert plan.sampler(offline=False, shares={}) is None  # every step alike
    assert plan.rate_limiter() is None  # no buffer.samples_per_insert
    assert plan.terminate_on_success


def test_sac_settings_build_a_gaussian_actor_with_rlpd_sampling() -> None:
    spec = spec_for(
        "sac", hyperparameters={"gamma": 0.95, "reward_scale": 0.2}, buffer={"online_fraction": 0.4}
    )
    plan = RunPlan.from_spec(spec)
    settings = plan.learner_settings(STATE_39, 4)
    algorithm = build_algorithm(settings, torch.device("cpu"))
    assert isinstance(algorithm, SACRLPD) and isinstance(algorithm.policy, GaussianPolicy)
    assert algorithm.config.gamma == 0.95 and algorithm.config.hidden == 32
    assert plan.batch_layout() == {"images": [], "chunk": 1, "next_images": False}
    assert plan.reward_scale == 0.2
    sampler = plan.sampler(offline=False, shares={})  # RLPD's symmetric halves
    assert isinstance(sampler, MixSampler) and sampler.prior == "interventions"
    assert sampler.online_fraction == 0.4
    assert plan.sampler(offline=True, shares={}).prior == "both"
    # SAC's critics read the successor's frames of a camera policy.
    cams = plan.batch_layout(images=["observation.images.top"])
    assert cams["images"] == ["observation.images.top"] and cams["next_images"] is True
    assert not plan.terminate_on_success


def test_sac_warm_start_protection_reaches_the_algorithm_with_documented_defaults() -> None:
    spec = spec_for("sac")
    algorithm = build_algorithm(
        RunPlan.from_spec(spec).learner_settings(STATE_39, 4), torch.device("cpu")
    )
    assert isinstance(algorithm, SACRLPD)
    cfg = algorithm.config
    assert (cfg.critic_warmup_updates, cfg.bc_weight) == (400, 1.0)
    assert cfg.init_temperature == 0.01 and algorithm.target_entropy == -4.0
    assert float(algorithm.log_alpha.detach().exp()) == pytest.approx(0.01)
    # Each one is a hyper-parameter of the run; an entropy may be negative, zero turns a
    # remedy off (plain SAC/RLPD).
    spec = spec_for(
        "sac",
        hyperparameters={
            "critic_warmup_updates": 0,
            "bc_weight": 0,
            "init_temperature": 0.1,
            "target_entropy": -2.5,
        },
    )
    algorithm = build_algorithm(
        RunPlan.from_spec(spec).learner_settings(STATE_39, 4), torch.device("cpu")
    )
    assert isinstance(algorithm, SACRLPD)
    assert (algorithm.config.critic_warmup_updates, algorithm.config.bc_weight) == (0, 0.0)
    assert algorithm.target_entropy == -2.5


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("bc_weight", -1.0, "must be positive"),
        ("critic_warmup_updates", 2.5, "must be an integer"),
        ("critic_warmup_updates", -10, "must be positive"),
        ("init_temperature", 0, "must be positive"),
        ("target_entropy", "low", "must be a number"),
    ],
)
def test_bad_sac_warm_start_settings_are_refused_by_name(key: str, value: Any, why: str) -> None:
    errors = refusal(spec_for("sac", hyperparameters={key: value}))
    assert set(errors) == {f"hyperparameters.{key}"}
    assert why in errors[f"hyperparameters.{key}"]


@pytest.mark.parametrize("key", ["bc_weight", "critic_warmup_updates", "target_entropy"])
def test_sac_warm_start_settings_are_refused_for_other_algorithms(key: str) -> None:
    errors = refusal(spec_for("recap", hyperparameters={key: 1}))
    assert set(errors) == {f"hyperparameters.{key}"}
    assert "'sac'" in errors[f"hyperparameters.{key}"]


def test_hg_dagger_settings_are_unchanged_so_its_checkpoints_still_resume() -> None:
    spec = spec_for("hg-dagger", hyperparameters={"lr": 0.002})
    plan = RunPlan.from_spec(spec)
    settings = plan.learner_settings(STATE_39, 4)
    assert settings.algorithm_config == {"lr": 0.002}
    assert settings.policy.kind == "mlp" and settings.sampler == "intervention"
    assert isinstance(build_algorithm(settings, torch.device("cpu")), HGDAgger)
    assert isinstance(plan.sampler(offline=False, shares={}), InterventionSampler)
    shares = {"reach-v3": 0.7}
    adaptive = spec_for("hg-dagger", buffer={"mix": "adaptive"})
    mixed = RunPlan.from_spec(adaptive).sampler(offline=True, shares=shares)
    assert isinstance(mixed, MixSampler) and mixed.online_fraction is shares  # the live shares
    limited = RunPlan.from_spec(spec_for("hg-dagger", buffer={"samples_per_insert": 64}))
    limiter = limited.rate_limiter()
    assert limiter is not None and limiter.samples_per_insert == 64 and not limiter.block_inserts
    assert not plan.terminate_on_success


@pytest.mark.parametrize("algorithm", ["hg-dagger", "recap", "sac"])
def test_demo_builds_a_spec_the_run_manager_accepts(algorithm: str) -> None:
    common = ["--tasks", "reach-v3,push-v3", "--robots", "2", "--minutes", "1"]
    args = build_parser().parse_args([*common, "--algorithm", algorithm, "--eval-episodes", "2"])
    spec = demo_spec(args)
    assert spec.algorithm == algorithm and spec.policy.kind == KINDS[algorithm]
    assert spec.demonstrations.episodes_per_task == 1 and spec.evaluation.on == "simulator"
    RunPlan.from_spec(spec)  # raises on anything the run manager would refuse


def test_a_demo_on_cameras_trains_a_cnn_measured_by_the_robots() -> None:
    argv = ["--tasks", "reach-v3", "--cameras", "corner", "--offline-data", "reach-demos"]
    spec = demo_spec(build_parser().parse_args(argv))
    assert spec.policy.kind == "cnn" and spec.evaluation.on == "robots"
    assert [s.source for s in spec.buffer.offline_data] == ["reach-demos"]
    RunPlan.from_spec(spec)
