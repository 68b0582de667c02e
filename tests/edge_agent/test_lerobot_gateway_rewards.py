"""The run's reward source on a gateway robot: ``classifier`` replaces the reward LeRobot's
actor sent (0.0 until a classifier version arrives, then the classifier's), ``robot`` keeps it,
``labels`` is refused by name; the run report says which robots' rewards were replaced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from lerobot.transport.utils import transitions_to_bytes

from cloud_learner.reward_classifier import RewardClassifier
from edge_agent.episodes import EpisodeLog
from edge_agent.lerobot_gateway.features import actor_config
from edge_agent.lerobot_gateway.rewards import GatewayReward, RewardSourceRefused
from edge_agent.lerobot_gateway.transitions import TransitionIntake
from foundation.runspec import parse_run_spec
from runs.report import write_report
from tests.edge_agent.lerobot_actor import transition

CONFIG = {
    "policy": {
        "input_features": {"observation.state": {"type": "STATE", "shape": [4]}},
        "output_features": {"action": {"type": "ACTION", "shape": [2]}},
    }
}
FEATURES = {"observation.state": {"dtype": "float32", "shape": (4,)}}


def _classifier(p_logit: float) -> dict[str, torch.Tensor]:
    """A version's classifier tensors whose P(success) is sigmoid(p_logit) everywhere."""
    model = RewardClassifier(FEATURES, version=1)
    with torch.no_grad():
        last = model.net.head[-1]
        last.weight.zero_()
        last.bias.fill_(p_logit)
    return model.to_tensors()


def _rewards(intake: TransitionIntake, sent: list[float]) -> list[float]:
    s, a = torch.arange(4, dtype=torch.float32), torch.tensor([0.1, -0.2])
    episode = [transition(s, a, reward=r, done=i == len(sent) - 1) for i, r in enumerate(sent)]
    rows, refused = intake.convert(transitions_to_bytes(episode), 1)
    assert refused == []
    return [row["reward"] for row in rows]


def _intake(tmp_path: Path, reward: GatewayReward) -> TransitionIntake:
    ids = {"robot_id": "7", "run_id": "r", "task": "t"}
    tmp_path.mkdir()
    return TransitionIntake(actor_config(CONFIG).schema(), EpisodeLog(tmp_path), ids, 10.0, reward)


def test_classifier_replaces_lerobots_reward_robot_keeps_it(tmp_path: Path) -> None:
    sent = [0.3, 0.0, 1.0]
    kept = _intake(tmp_path / "robot", GatewayReward("robot"))
    assert _rewards(kept, sent) == pytest.approx(sent)

    reward = GatewayReward("classifier")
    assert reward.replaces
    intake = _intake(tmp_path / "classifier", reward)
    assert _rewards(intake, sent) == [0.0, 0.0, 0.0]  # no classifier yet, no verdicts
    reward.offer_weights(_classifier(8.0))
    assert _rewards(intake, sent) == [1.0, 1.0, 1.0]
    reward.offer_weights(_classifier(-8.0))  # same version: the running one is kept
    assert _rewards(intake, sent) == [1.0, 1.0, 1.0]


def test_labels_and_unknown_sources_are_refused_by_name() -> None:
    with pytest.raises(RewardSourceRefused, match="'labels'.*verdicts"):
        GatewayReward("labels")
    with pytest.raises(RewardSourceRefused, match="'oracle'"):
        GatewayReward("oracle")


def test_the_run_report_says_whose_reward_was_replaced(tmp_path: Path) -> None:
    spec = parse_run_spec(
        {
            "algorithm": "lerobot-sac",
            "tasks": ["pick_cube"],
            "robots": {"robot_type": "lerobot-actor"},
            "reward": {"source": "classifier"},
        }
    )
    reports = {"arm-1": {"lerobot.rewards_replaced": 40.0}, "arm-2": {"steps": 3.0}}
    write_report(
        tmp_path,
        "run-1",
        spec,
        learner_restarts=0,
        accounts={},
        elapsed_s=60.0,
        robot_reports=reports,
    )
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["lerobot_rewards_replaced"] == {"arm-1": 40}
    text = (tmp_path / "report.txt").read_text()
    assert "classifier replaced the reward LeRobot's actor sent (steps: arm-1 40)" in text
