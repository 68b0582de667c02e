"""The cloud side of ``reward.source: classifier``: the learner of a run (``RunLearner``, on
its buffer's batch service) trains the classifier from the episodes people labelled in the
buffer (not the driver's nor the classifier's outcomes), logs its held-out figures and
publishes the next policy version with the classifier inside."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load

from buffer import ReplayBuffer, StepSchema
from buffer.service.batches import BatchServer
from buffer.table.labels import labelled_episodes
from cloud_learner.classifier_training import SAVED, ClassifierTrainer
from cloud_learner.metrics import read_metrics
from cloud_learner.process import RunLearner
from cloud_learner.reward_classifier import CARD_KEY, RewardClassifier, read_card
from comms.cloud.weight_file import latest_version, read_weights, weight_file_name
from edge_agent.policy_build import CardPolicy
from foundation.runspec import ClassifierSpec
from tests.buffer.helpers import BATCH_TOKEN
from tests.cloud_learner.helpers import ACTION, STATE
from tests.fakes.labelled_reach import buffer_records, reach_episodes

MACHINE = {3: "driver", 5: "classifier"}  # outcomes no person gave


@pytest.fixture(scope="module")
def reach():
    return reach_episodes(20, steps=50)


def _run_dir(tmp_path: Path, reach) -> tuple[Path, ReplayBuffer]:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    spec = {
        "version": 1,
        "algorithm": "hg-dagger",
        "tasks": ["reach-v3"],
        "policy": {"kind": "mlp", "hidden_sizes": [16, 16]},
        "robots": {"robot_type": "metaworld-sawyer", "count": 1},
        "hyperparameters": {"bc_updates": 2, "batch_size": 32, "updates_per_s": 0},
        "publish": {"every_updates": 10},
        "reward": {
            "source": "classifier",
            "classifier": {
                "min_labelled_episodes": 8,
                "every_updates": 5,
                "holdout_fraction": 0.25,
            },
        },
    }
    (run_dir / "spec.json").write_text(json.dumps(spec))
    schema = StepSchema.from_features({"observation.state": STATE}, {"action": ACTION})
    buf = ReplayBuffer.open(run_dir / "buffer", schema)
    buf.append(schema.batch_from_records(buffer_records(reach)))
    for e, ep in enumerate(reach.episodes):
        buf.mark_episode("robot-1", "run-1", e, ep.verdict, MACHINE.get(e, "SimulatedPerson"))
    return run_dir, buf


def test_learner_trains_the_classifier_and_ships_it_in_the_next_version(tmp_path, reach) -> None:
    run_dir, buf = _run_dir(tmp_path, reach)
    labelled = labelled_episodes(buf)
    assert [e.key[2] for e in labelled] == [e for e in range(20) if e not in MACHINE]
    assert all(e.reason == "SimulatedPerson" for e in labelled)
    server = BatchServer(buf, ["reach-v3"], token=BATCH_TOKEN)
    proc = RunLearner.open(run_dir, server.address, token=BATCH_TOKEN)
    try:
        assert proc.classifier is not None
        proc.classifier.epochs = 15
        proc.run(lambda: proc.learner.step >= 12, lambda: False)
    finally:
        proc.close()
        server.close()
        buf.close()
    rows = read_metrics(run_dir, prefix="classifier")
    # trained at update 5; at update 10 no label had changed: no second version
    assert [r["step"] for r in rows] == [5]
    assert [r["classifier_version"] for r in rows] == [1.0]
    last = rows[-1]
    assert last["classifier_train_episodes"] + last["classifier_holdout_episodes"] == 18
    assert last["classifier_holdout_episodes"] >= 1
    assert 0.0 <= last["classifier_precision"] <= 1.0 and 0.0 <= last["classifier_recall"] <= 1.0
    # version 1 (the warm start) has no classifier yet; the version published at update 10
    # carries the one trained at update 5
    weights = run_dir / "weights"
    version = latest_version(weights)
    assert version == 2
    first = load(bytes(read_weights(weights / weight_file_name(1))))
    shipped = load(bytes(read_weights(weights / weight_file_name(2))))
    assert CARD_KEY not in first and CARD_KEY in shipped
    card = read_card(shipped)
    assert card is not None and card["version"] == 1 and card["threshold"] == 0.5
    model = RewardClassifier.from_tensors(shipped)
    assert model.success_probability(reach.episodes[0].frames).shape == (
        len(reach.episodes[0].frames["observation.state"]),
    )
    # the robot's policy loads the same version, classifier tensors and all
    CardPolicy(39, 4, 1, 16).set_weights(shipped)
    # a restarted learner ships the saved classifier again
    again = ClassifierTrainer(ClassifierSpec(), {"observation.state": STATE}, run_dir)
    assert (run_dir / SAVED).is_file() and again.version == 1


def test_a_new_label_trains_the_next_version_and_the_same_labels_none(tmp_path, reach) -> None:
    from buffer.service.batches import RemoteBuffer

    run_dir, buf = _run_dir(tmp_path, reach)
    server = BatchServer(buf, ["reach-v3"], token=BATCH_TOKEN)
    remote = RemoteBuffer(server.address, token=BATCH_TOKEN)
    try:
        spec = ClassifierSpec(min_labelled_episodes=8, holdout_fraction=0.25)
        trainer = ClassifierTrainer(spec, {"observation.state": STATE}, tmp_path, epochs=5)
        assert trainer.train(remote) is not None and trainer.version == 1
        assert trainer.train(remote) is None and trainer.version == 1  # nothing new
        # a person labels an episode the driver had ended: a new label, a new version
        buf.mark_episode("robot-1", "run-1", 3, reach.episodes[3].verdict, "SimulatedPerson")
        figures = trainer.train(remote)
        assert figures is not None and trainer.version == 2
        total = figures["classifier_train_episodes"] + figures["classifier_holdout_episodes"]
        assert total == 19
    finally:
        remote.close()
        server.close()
        buf.close()


def test_too_few_labels_train_nothing(tmp_path, reach) -> None:
    run_dir, buf = _run_dir(tmp_path, reach)
    server = BatchServer(buf, ["reach-v3"], token=BATCH_TOKEN)
    from buffer.service.batches import RemoteBuffer

    remote = RemoteBuffer(server.address, token=BATCH_TOKEN)
    try:
        spec = ClassifierSpec(min_labelled_episodes=40)
        trainer = ClassifierTrainer(spec, {"observation.state": STATE}, tmp_path)
        assert trainer.train(remote) is None and trainer.tensors() == {}
    finally:
        remote.close()
        server.close()
        buf.close()
