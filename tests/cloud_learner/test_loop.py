"""The learner loop: start gate, rate limiter, publishing, metrics, policies' act/weights."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load, load_file, save

from cloud_learner.batch import BatchError, to_torch_batch
from cloud_learner.config import LearnerSettings
from cloud_learner.core import Algorithm, BatchSource, Policy
from cloud_learner.factory import build_algorithm, model_config
from cloud_learner.loop import Learner
from cloud_learner.metrics import read_metrics
from cloud_learner.policies import FlowMatchingPolicy, MLPPolicy, PolicySpec
from cloud_learner.publisher import InMemoryWeightPublisher
from cloud_learner.sources import InMemorySource
from comms.cloud.weight_file import WeightDirectory, weight_file_name
from foundation.contracts import WeightPublisher
from tests.cloud_learner.helpers import columns


def _settings(**kw: object) -> LearnerSettings:
    base: dict[str, object] = dict(
        algorithm="hg_dagger",
        min_transitions=100,
        batch_size=8,
        log_every_updates=1,
        publish_every_updates=4,
        checkpoint_every_updates=1000,
        publish_every_seconds=1e9,
        policy={"state_dim": 5, "action_dim": 2, "hidden": 16},
    )
    base.update(kw)
    return LearnerSettings.model_validate(base)


def _learner(
    run_dir: Path, settings: LearnerSettings, source: BatchSource, publisher: WeightPublisher
) -> Learner:
    """A learner on CPU with the algorithm and model config ``settings`` describe."""
    return Learner(
        run_dir,
        build_algorithm(settings, torch.device("cpu")),
        source,
        publisher,
        settings,
        model_config(settings),
    )


def test_implementations_satisfy_the_core_protocols(tmp_path: Path) -> None:
    algo = build_algorithm(_settings(), torch.device("cpu"))
    assert isinstance(algo, Algorithm)
    assert isinstance(algo.policy, Policy)
    assert isinstance(InMemorySource(columns()), BatchSource)
    assert isinstance(WeightDirectory(tmp_path), WeightPublisher)
    assert isinstance(InMemoryWeightPublisher(), WeightPublisher)


def test_training_waits_for_min_transitions_then_starts(tmp_path: Path) -> None:
    cols = columns(n=300)
    source = InMemorySource({k: v[:50] for k, v in cols.items()})
    settings = _settings(max_updates=12)
    learner = _learner(tmp_path, settings, source, InMemoryWeightPublisher())
    learner.start(resume=False)
    stop = threading.Event()
    worker = threading.Thread(
        target=learner.run, kwargs={"should_stop": stop.is_set, "idle_sleep": 0.01}
    )
    worker.start()
    worker.join(timeout=0.3)
    assert worker.is_alive() and learner.step == 0  # 50 < 100 transitions: no update yet
    source.extend({k: v[50:] for k, v in cols.items()})  # the fleet delivers more steps
    worker.join(timeout=30)
    stop.set()
    assert not worker.is_alive() and learner.step == 12
    learner.close()
    started = read_metrics(tmp_path, prefix="start")
    assert started == [{"step": 0, "prefix": "start", "robot_steps": 300.0, "offline_steps": 0.0}]
    steps = [m["step"] for m in read_metrics(tmp_path)]
    assert steps == list(range(1, 13))


def test_rate_limiter_bounds_updates_per_inserted_transition(tmp_path: Path) -> None:
    # 2 samples per insert with 100 rows -> at most 200 sampled rows -> 25 batches of 8.
    source = InMemorySource(columns(n=100), samples_per_insert=2.0)
    settings = _settings(max_updates=1000)
    learner = _learner(tmp_path, settings, source, InMemoryWeightPublisher())
    learner.start(resume=False)
    polls = iter(range(200))
    learner.run(should_stop=lambda: next(polls) >= 199, idle_sleep=0.0)
    assert learner.step == 25
    learner.close()


def test_publishes_every_n_updates_with_increasing_versions(tmp_path: Path) -> None:
    publisher = WeightDirectory(tmp_path / "weights", keep=2)
    settings = _settings(max_updates=12, min_transitions=1)
    learner = _learner(tmp_path, settings, InMemorySource(columns()), publisher)
    learner.start(resume=False)
    learner.run()
    learner.close()
    version = publisher.latest_version()
    weights = load_file(str(tmp_path / "weights" / weight_file_name(version)))
    assert version == 3 == learner.version
    policy = learner.algorithm.policy
    assert isinstance(policy, MLPPolicy)
    for key, value in policy.get_weights().items():
        assert torch.equal(value, weights[key]), key
    assert len(list((tmp_path / "weights").glob("v*.safetensors"))) == 2
    with pytest.raises(ValueError, match="not above"):
        publisher.publish(3, weights)


def test_metrics_land_in_tensorboard_event_files(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    settings = _settings(max_updates=5, min_transitions=1)
    learner = _learner(tmp_path, settings, InMemorySource(columns()), InMemoryWeightPublisher())
    learner.start(resume=False)
    learner.run()
    learner.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("learner/loss")] == [1, 2, 3, 4, 5]


def test_batch_adapter_converts_and_rejects_bad_batches() -> None:
    cols = columns(n=4)
    cols["observation.images.front"] = np.zeros((4, 8, 8, 3), np.uint8)
    cols["robot_id"] = np.array(["a", "b", "c", "d"])
    batch = to_torch_batch(cols)
    assert batch["observation.state"].dtype == torch.float32
    assert batch["task_index"].dtype == torch.int64
    assert batch["is_intervention"].dtype == torch.bool
    assert batch["observation.images.front"].dtype == torch.uint8
    assert "robot_id" not in batch
    with pytest.raises(BatchError, match=r"missing \['action'\]"):
        to_torch_batch({k: v for k, v in cols.items() if k != "action"})
    with pytest.raises(BatchError, match="batch size 4.*'reward': 3"):
        to_torch_batch({**cols, "reward": np.zeros(3, np.float32)})
    with pytest.raises(BatchError, match=r"observation.images.front must be \(B, H, W, 3\) uint8"):
        to_torch_batch({**cols, "observation.images.front": np.zeros((4, 8, 8, 3), np.float32)})


@pytest.mark.parametrize(
    ("spec", "cls", "shape"),
    [
        (PolicySpec(state_dim=5, action_dim=2, num_tasks=3), MLPPolicy, (2,)),
        (
            PolicySpec(
                state_dim=5,
                action_dim=2,
                num_tasks=3,
                task_conditioning="embedding",
                image_keys=["observation.images.front"],
                image_shape=(32, 32),
            ),
            MLPPolicy,
            (2,),
        ),
        (
            PolicySpec(
                state_dim=5,
                action_dim=2,
                num_tasks=3,
                task_conditioning="text",
                text_embedding_dim=6,
                chunk_size=4,
            ),
            FlowMatchingPolicy,
            (4, 2),
        ),
    ],
)
def test_policies_act_and_ship_weights_as_raw_tensors(
    spec: PolicySpec, cls: type[MLPPolicy], shape: tuple[int, ...]
) -> None:
    torch.manual_seed(0)
    policy = cls(spec)
    obs = {
        "observation.state": np.ones(5, np.float32),
        "observation.images.front": np.full((32, 32, 3), 128, np.uint8),
    }
    torch.manual_seed(1)
    action = policy.act(obs, task=2)
    assert action.shape == shape and action.dtype == np.float32
    blob = save(policy.get_weights())  # safetensors bytes: what comms ships
    robot = cls(spec)
    robot.set_weights(load(blob))
    torch.manual_seed(1)
    np.testing.assert_array_equal(robot.act(obs, task=2), action)
    with pytest.raises(ValueError, match="task_index out of range"):
        policy.act(obs, task=3)


def test_set_weights_names_missing_and_misshaped_tensors() -> None:
    policy = MLPPolicy(PolicySpec(state_dim=5, action_dim=2, hidden=16))
    weights = policy.get_weights()
    weights["head.0.weight"] = torch.zeros(3, 3)
    del weights["head.2.bias"]
    with pytest.raises(ValueError) as err:
        policy.set_weights(weights)
    assert "missing keys ['head.2.bias']" in str(err.value)
    assert "head.0.weight: expected shape (16, 5), got (3, 3)" in str(err.value)


def test_learner_publishes_through_the_weight_directory_to_the_comms_distributor(
    tmp_path: Path,
) -> None:
    from comms.cloud.distributor import WeightDistributor
    from comms.cloud.weight_file import WeightFileFeed

    directory = WeightDirectory(tmp_path / "weights")
    directory.publish(5, {"w": torch.zeros(2)})  # published before a crash: robots may hold it
    comms = WeightDistributor("run-1")
    try:
        settings = _settings(max_updates=8, min_transitions=1)
        learner = _learner(tmp_path, settings, InMemorySource(columns()), directory)
        learner.start(resume=False)
        learner.run()
        learner.close()
        feed = WeightFileFeed(comms, tmp_path / "weights")  # the cloud process's side
        got = feed.poll()
        assert got is not None and got[0] == learner.version == 7  # above the floor
        assert comms.flush(timeout=30)
        latest = comms.latest()
        assert latest is not None and latest.version == 7
    finally:
        comms.close()


def test_a_version_published_but_never_recorded_before_a_crash_is_announced_at_restart(
    tmp_path: Path,
) -> None:
    """The crash window between a weight file and its metadata row (a SIGKILL there left a
    gap in the dashboard's versions): the restarted learner announces the version again."""

    class Killed(BaseException):
        pass

    recorded: list[tuple[str, int]] = []

    def dying_hook(kind: str, data: object) -> None:
        assert isinstance(data, dict)
        if kind == "published" and data["version"] == 3:
            raise Killed  # the process dies after v3's file is written, before its row
        recorded.append((kind, int(data.get("version", data.get("learner_step", -1)))))

    settings = _settings(publish_every_updates=4, checkpoint_every_updates=4, max_updates=100)
    weights = WeightDirectory(tmp_path / "weights")
    first = _learner(tmp_path, settings, InMemorySource(columns(n=300)), weights)
    first.hook = dying_hook
    first.start(resume=False)
    with pytest.raises(Killed):
        first.run(should_stop=lambda: False, idle_sleep=0.01)
    assert weights.latest_version() == 3 and ("published", 3) not in recorded

    seen: dict[int, int] = {}

    def hook(kind: str, data: object) -> None:
        assert isinstance(data, dict)
        if kind == "published":
            seen[int(data["version"])] = int(data["learner_step"])

    second = _learner(
        tmp_path,
        settings.model_copy(update={"max_updates": 0}),
        InMemorySource(columns(n=300)),
        weights,
    )
    second.hook = hook
    assert second.start(resume=True)
    assert seen == {3: 12, 4: second.step}  # v3 (its own learner step) again, then the new v4
