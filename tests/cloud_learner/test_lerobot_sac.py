"""LeRobot's own SAC and HIL-SERL actor trained by robofleet's learner (algorithm ``lerobot-sac``):
it trains from a real replay buffer, its versions load into an unmodified LeRobot actor-side
algorithm through LeRobot's own ``update_policy_parameters`` and then act as the learner's,
features LeRobot's policy cannot take are refused by name, and checkpoints resume exactly."""

from __future__ import annotations

from pathlib import Path
from queue import Queue
from typing import Any

import numpy as np
import pytest
import torch

from buffer import MixSampler, ReplayBuffer, StepSchema
from cloud_learner.factory import build_algorithm, model_config
from cloud_learner.lerobot_parameters import NotALeRobotVersion, actor_config, parameter_bytes
from cloud_learner.loop import Learner
from cloud_learner.policy_card import CardPublisher, card_for, split_card
from cloud_learner.publisher import InMemoryWeightPublisher
from cloud_learner.run_plan import RunPlan, parse_spec
from cloud_learner.sources import BufferSource
from foundation.runspec import RunSpecError
from tests.buffer.helpers import BATCH_TOKEN

STATE_MIN, STATE_MAX = [-3.0, -3.0, -3.0], [3.0, 3.0, 3.0]
FEATURES: dict[str, dict[str, Any]] = {"observation.state": {"dtype": "float32", "shape": (3,)}}
CAMERA = "observation.images.wrist"
WITH_CAMERA = {**FEATURES, CAMERA: {"dtype": "image", "shape": (40, 40, 3)}}
ACTION = {"action": {"dtype": "float32", "shape": (2,)}}


def _spec(**config: Any) -> dict[str, Any]:
    bounds = {
        "state_min": STATE_MIN,
        "state_max": STATE_MAX,
        "action_min": [-1.0, -1.0],
        "action_max": [1.0, 1.0],
    }
    return {
        "algorithm": "lerobot-sac",
        "tasks": ["pick-cube"],
        "robots": {"robot_type": "so101"},
        "policy": {"hidden_sizes": [16, 16], "config": {"latent_dim": 8, **bounds, **config}},
        "hyperparameters": {"batch_size": 16, "checkpoint_every_updates": 5, "lr": 1e-3},
        "buffer": {"min_size": 20},
    }


def _plan(**config: Any) -> RunPlan:
    return RunPlan.from_spec(parse_spec(_spec(**config)))


def _steps(n: int, camera: bool = False) -> list[dict[str, Any]]:
    """``n`` buffer steps of 20-step episodes ending in success (reward 1, terminated), every
    third step the operator's."""
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        end = i % 20 == 19
        rec: dict[str, Any] = {
            "seq": i,
            "robot_id": "so101-a",
            "run_id": "run-a",
            "task": "pick-cube",
            "episode_index": i // 20,
            "frame_index": i % 20,
            "timestamp": i / 10.0,
            "reward": float(end),
            "terminated": end,
            "truncated": False,
            "is_intervention": i % 3 == 0,
            "policy_version": 1,  # 0 would be a demonstration episode
            "observation.state": rng.uniform(-3, 3, 3).astype(np.float32),
            "action": rng.uniform(-1, 1, 2).astype(np.float32),
        }
        if camera:
            rec[CAMERA] = rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)
        if end:
            rec["next.observation.state"] = np.zeros(3, np.float32)
            if camera:
                rec["next." + CAMERA] = np.zeros((40, 40, 3), np.uint8)
        out.append(rec)
    return out


def _learner(
    run_dir: Path, buf: ReplayBuffer, plan: RunPlan, features: dict[str, Any] = FEATURES
) -> Learner:
    settings = plan.learner_settings(features, 2)
    algorithm = build_algorithm(settings, torch.device("cpu"))
    publisher = CardPublisher(
        InMemoryWeightPublisher(), card_for(settings.algorithm, algorithm.policy)
    )
    return Learner(
        run_dir,
        algorithm,
        BufferSource(buf, settings.tasks, sampler=MixSampler(0.5, prior="interventions")),
        publisher,
        settings,
        model_config(settings),
        spec=plan.model_spec(),
    )


def _open_buffer(path: Path, camera: bool = False) -> ReplayBuffer:
    schema = StepSchema.from_features(WITH_CAMERA if camera else FEATURES, ACTION)
    buf = ReplayBuffer.open(path, schema)
    buf.append(schema.batch_from_records(_steps(60, camera)))
    return buf


@pytest.fixture()
def buffer(tmp_path: Path) -> Any:
    buf = _open_buffer(tmp_path / "buffer")
    yield buf
    buf.close()


def _actor_side(camera: bool = False, discrete: bool = False) -> Any:
    """LeRobot's actor-side algorithm as ``python -m lerobot.rl.actor`` builds it, from the
    config its user writes (the run's bounds as ``dataset_stats``), not from robofleet's."""
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.gaussian_actor.configuration_gaussian_actor import (
        ActorNetworkConfig,
        GaussianActorConfig,
    )
    from lerobot.policies.gaussian_actor.modeling_gaussian_actor import GaussianActorPolicy
    from lerobot.rl.algorithms.factory import make_algorithm
    from lerobot.rl.algorithms.sac.configuration_sac import SACAlgorithmConfig

    inputs = {"observation.state": PolicyFeature(FeatureType.STATE, (3,))}
    if camera:
        inputs[CAMERA] = PolicyFeature(FeatureType.VISUAL, (3, 40, 40))
    cfg = GaussianActorConfig(
        input_features=inputs,
        output_features={"action": PolicyFeature(FeatureType.ACTION, (2,))},
        dataset_stats={
            "observation.state": {"min": STATE_MIN, "max": STATE_MAX},
            "action": {"min": [-1.0, -1.0], "max": [1.0, 1.0]},
        },
        latent_dim=8,
        image_encoder_hidden_dim=4,
        num_discrete_actions=3 if discrete else None,
        actor_network_kwargs=ActorNetworkConfig(hidden_dims=[16, 16]),
    )
    policy = GaussianActorPolicy(cfg).eval()
    return make_algorithm(cfg=SACAlgorithmConfig(policy_config=cfg), policy=policy)


def _actor_action(algorithm: Any, observation: dict[str, np.ndarray], seed: int) -> np.ndarray:
    """What LeRobot's actor loop does with one observation (``act_with_policy``): frames
    arrive as its environment processors make them, (1, 3, H, W) float32 in [0, 1]."""
    from lerobot.policies import make_pre_post_processors

    cfg = algorithm.policy.config
    pre, post = make_pre_post_processors(policy_cfg=cfg, dataset_stats=cfg.dataset_stats)
    raw = {"observation.state": torch.as_tensor(observation["observation.state"])}
    if CAMERA in observation:
        frame = torch.as_tensor(observation[CAMERA]).permute(2, 0, 1)[None].float() / 255.0
        raw[CAMERA] = frame
    obs = pre.process_observation(raw)
    torch.manual_seed(seed)
    action = post.process_action(algorithm.policy.select_action(batch=obs))
    result: np.ndarray = action[0].numpy()
    return result


@pytest.mark.parametrize("camera", [False, True], ids=["state", "camera"])
def test_trains_and_its_version_loads_into_lerobots_actor(tmp_path: Path, camera: bool) -> None:
    from lerobot.rl.actor import update_policy_parameters
    from lerobot.transport.utils import state_to_bytes

    plan = _plan(image_encoder_hidden_dim=4)
    buffer = _open_buffer(tmp_path / "buffer", camera)
    features = WITH_CAMERA if camera else FEATURES
    learner = _learner(tmp_path / "run", buffer, plan, features)
    learner.start(resume=False)
    before = learner.algorithm.get_weights()
    losses = [learner.train_step() for _ in range(8)]
    learner.publish()
    learner.close()
    buffer.close()
    critic = [m["loss_critic"] for m in losses]
    assert len(set(critic)) > 1 and all(np.isfinite(critic))
    assert {"loss_actor", "loss_temperature", "temperature"} <= set(losses[-1])
    after = learner.algorithm.get_weights()
    assert any(not torch.equal(before[k], after[k]) for k in before)

    versions = learner.publisher.inner.versions
    weights = versions[max(versions)]
    data = parameter_bytes(weights)
    # Exactly what LeRobot's learner streams: state_to_bytes of SACAlgorithm.get_weights().
    assert data == state_to_bytes(learner.algorithm.sac.get_weights())

    actor = _actor_side(camera)
    # The version says which actor config it fits: the one the actor's user wrote.
    trained_with = actor_config(weights)
    theirs = actor.policy.config
    assert trained_with.input_features == theirs.input_features
    assert trained_with.output_features == theirs.output_features
    assert trained_with.dataset_stats == theirs.dataset_stats
    obs = {"observation.state": np.array([0.5, -1.0, 2.0], np.float32)}
    if camera:
        obs[CAMERA] = np.random.default_rng(1).integers(0, 255, (40, 40, 3), dtype=np.uint8)
    untrained = _actor_action(actor, obs, seed=3)
    queue: Queue[bytes] = Queue()
    queue.put(data)
    update_policy_parameters(algorithm=actor, parameters_queue=queue, device="cpu")
    loaded = _actor_action(actor, obs, seed=3)
    torch.manual_seed(3)
    mine = learner.algorithm.policy.act(obs)
    # The bytes are exactly LeRobot's (checked above); a convolution's summation order may
    # differ between calls, so the actions agree to float32 rounding, not bit for bit.
    np.testing.assert_allclose(loaded, mine, rtol=1e-5, atol=1e-6)
    assert not np.array_equal(untrained, mine)
    # Edge agents build the same network from the version's card alone.
    card, rest = split_card(weights)
    assert card is not None
    robot_policy = card.build()
    robot_policy.set_weights(rest)
    torch.manual_seed(3)
    np.testing.assert_allclose(robot_policy.act(obs), mine, rtol=1e-5, atol=1e-6)


def test_another_algorithms_version_is_refused_by_name() -> None:
    with pytest.raises(NotALeRobotVersion, match="no policy card"):
        parameter_bytes({"policy.mean_layer.weight": torch.zeros(2, 2)})


def test_features_lerobots_policy_cannot_take_are_refused_by_name() -> None:
    plan = _plan()
    assert plan.feature_errors(FEATURES, 2) == {}
    wrong_state = {"observation.state": {"dtype": "float32", "shape": (4,)}}
    errors = plan.feature_errors(wrong_state, 3)
    assert "3 values, observation.state has 4" in errors["policy.config.state_min"]
    assert "2 values, action has 3" in errors["policy.config.action_max"]
    with pytest.raises(ValueError, match=r"policy.config.state_max: 3 values"):
        build_algorithm(plan.learner_settings(wrong_state, 2), torch.device("cpu"))
    with pytest.raises(RunSpecError) as err:
        _plan(hidden_width=4)
    assert "policy.config.hidden_width" in err.value.errors
    missing = RunPlan.from_spec(parse_spec({**_spec(), "policy": {"config": {}}}))
    assert "required" in missing.feature_errors(FEATURES, 2)["policy.config.action_min"]


def test_checkpoint_resumes_lerobots_algorithm_exactly(tmp_path: Path, buffer: Any) -> None:
    plan = _plan()
    first = _learner(tmp_path / "run", buffer, plan)
    first.start(resume=False)
    for _ in range(5):  # checkpoint_every_updates: 5
        first.train_step()
    batch = first.source.sample(16)
    torch.manual_seed(7)
    expected = first.algorithm.update(batch)
    first.close()

    resumed = _learner(tmp_path / "run", buffer, plan)
    assert resumed.start(resume=True)
    assert resumed.step == 5
    torch.manual_seed(7)
    assert resumed.algorithm.update(batch) == expected
    resumed.close()


def test_launch_refuses_robots_whose_features_do_not_fit_by_name(tmp_path: Path) -> None:
    from foundation.store.metadata_store import MetadataStore, upgrade
    from foundation.store.models import Robot
    from hal.spec import Capabilities, RobotSpec
    from runs.manager import validate_launch

    url = f"sqlite:///{tmp_path}/meta.db"
    upgrade(url)
    store = MetadataStore(url)
    robot = RobotSpec(
        robot_type="so101",
        observation_features={"observation.state": {"dtype": "float32", "shape": (4,)}},
        action_features=ACTION,
        control_hz=10.0,
        capabilities=Capabilities(
            can_reset=True, simulated=True, reward="sparse", detects_success=True
        ),
        action_low=[-1.0, -1.0],
        action_high=[1.0, 1.0],
    )
    with store.session() as s:
        s.add(Robot(name="so101-a", robot_type="so101", spec=robot.to_dict()))
    try:
        with pytest.raises(RunSpecError) as err:
            validate_launch(store, parse_spec(_spec()))
        assert "3 values, observation.state has 4" in err.value.errors["policy.config.state_min"]
        four = {"state_min": [-1.0] * 4, "state_max": [1.0] * 4}
        spec = validate_launch(store, parse_spec(_spec(**four)))
        assert spec.policy.kind == "lerobot-gaussian-actor"
    finally:
        store.close()


def test_spec_fields_the_lerobot_actor_does_not_support_are_refused_by_name() -> None:
    spec = _spec()
    spec["policy"] = {**spec["policy"], "chunk_size": 4, "init_from_run": "run-1"}
    with pytest.raises(RunSpecError) as err:
        RunPlan.from_spec(parse_spec(spec))
    assert set(err.value.errors) == {"policy.chunk_size", "policy.init_from_run"}
    # A knob SAC/RLPD and LeRobot's SAC both have names both to another algorithm.
    other = {**_spec(), "algorithm": "hg-dagger", "policy": {}, "hyperparameters": {"gamma": 0.9}}
    with pytest.raises(RunSpecError) as err:
        RunPlan.from_spec(parse_spec(other))
    assert "'sac' or 'lerobot-sac' only" in err.value.errors["hyperparameters.gamma"]


def test_a_discrete_gripper_trains_and_ships_lerobots_discrete_critic() -> None:
    from lerobot.rl.actor import update_policy_parameters

    plan = _plan(num_discrete_actions=3)
    settings = plan.learner_settings(FEATURES, 3)  # two continuous dimensions and the gripper
    algorithm = build_algorithm(settings, torch.device("cpu"))
    rng = np.random.default_rng(0)
    batch = {
        "observation.state": torch.as_tensor(rng.uniform(-3, 3, (16, 3)), dtype=torch.float32),
        "next.observation.state": torch.as_tensor(rng.uniform(-3, 3, (16, 3))).float(),
        "action": torch.cat(
            [torch.rand(16, 2) * 2 - 1, torch.as_tensor(rng.integers(0, 3, (16, 1))).float()], 1
        ),
        "reward": torch.as_tensor(rng.random(16) < 0.2).float(),
        "terminated": torch.as_tensor(rng.random(16) < 0.2),
        "is_intervention": torch.as_tensor(rng.random(16) < 0.5),
    }
    metrics = algorithm.update(batch)
    assert np.isfinite(metrics["loss_discrete_critic"])
    weights = card_publisher_version(settings.algorithm, algorithm)
    actor = _actor_side(discrete=True)
    queue: Queue[bytes] = Queue()
    queue.put(parameter_bytes(weights))
    update_policy_parameters(algorithm=actor, parameters_queue=queue, device="cpu")
    mine = algorithm.policy.policy
    for part in ("actor", "discrete_critic"):
        theirs = getattr(actor.policy, part).state_dict()
        for key, value in getattr(mine, part).state_dict().items():
            assert torch.equal(theirs[key], value), (part, key)


def card_publisher_version(name: str, algorithm: Any) -> dict[str, torch.Tensor]:
    """The version a run's publisher stores of ``algorithm``'s weights (card included)."""
    publisher = CardPublisher(InMemoryWeightPublisher(), card_for(name, algorithm.policy))
    publisher.publish(1, algorithm.get_weights())
    versions: dict[int, dict[str, torch.Tensor]] = publisher.inner.versions
    return versions[1]


def test_a_runs_learner_process_publishes_versions_lerobots_actor_loads(tmp_path: Path) -> None:
    """The cloud's learner of a ``lerobot-sac`` run (``RunLearner``, against the run's buffer
    service): the versions in its weights directory convert to bytes LeRobot's actor loads."""
    import json
    import threading
    import time

    from lerobot.rl.actor import update_policy_parameters
    from safetensors.torch import load_file

    from buffer.service.batches import BatchServer
    from cloud_learner.process import RunLearner
    from comms.cloud.weight_file import latest_version, weight_file_name

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    spec = _spec()
    spec["publish"] = {"every_updates": 5}
    spec["hyperparameters"] = {**spec["hyperparameters"], "updates_per_s": 0, "bc_updates": 0}
    (run_dir / "spec.json").write_text(json.dumps(spec))
    buf = _open_buffer(run_dir / "buffer")
    plan = RunPlan.from_spec(parse_spec(spec))
    server = BatchServer(buf, ["pick-cube"], plan.sampler(False, {}), token=BATCH_TOKEN)
    proc = RunLearner.open(run_dir, server.address, None, token=BATCH_TOKEN)
    stop = threading.Event()
    worker = threading.Thread(target=proc.run, args=(stop.is_set, lambda: False), daemon=True)
    try:
        worker.start()
        deadline = time.monotonic() + 60
        while latest_version(run_dir / "weights") < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        stop.set()
        worker.join(timeout=60)
        proc.close()
        server.close()
        buf.close()
    version = latest_version(run_dir / "weights")
    assert version >= 3, "the learner published no trained version"
    weights = load_file(str(run_dir / "weights" / weight_file_name(version)))
    actor = _actor_side()
    queue: Queue[bytes] = Queue()
    queue.put(parameter_bytes(weights))
    update_policy_parameters(algorithm=actor, parameters_queue=queue, device="cpu")
    _, flat = split_card(weights)
    for key, value in actor.policy.actor.state_dict().items():
        assert torch.equal(value, flat[f"policy.{key}"]), key
