"""Each evaluation episode a robot counts says who decided its outcome (heartbeat keys
``eval/<task>/by/<scorer>``, ``edge_agent.evaluation.scored_by``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edge_agent.evaluation import scored_by
from tests.edge_agent.helpers import BiasPolicy, FixedOperator, make_agent
from tests.fakes.robot import PointRobot
from tests.fakes.settings import fast_edge


class LabelsFirstEpisode(FixedOperator):
    """Says ``success`` on the first step it sees, then nothing."""

    def __init__(self) -> None:
        super().__init__(False)
        self.said = False

    def step(self, observation: Any, proposed: Any) -> Any:
        out = super().step(observation, proposed)
        if not self.said:
            out.command, self.said = "success", True
        return out


def test_an_operators_label_and_an_unlabelled_episode_are_counted_apart(tmp_path: Path) -> None:
    # The point robot detects no success: an episode nobody labelled was scored by nobody.
    agent = make_agent(
        tmp_path,
        PointRobot(episode_steps=5),
        BiasPolicy(),
        operator=LabelsFirstEpisode(),
        settings=fast_edge(evaluate_every_episodes=1),
    )
    agent.run(episodes=3)
    counts = agent.counts.tally.report()
    assert counts["eval/reach-v3/episodes"] == 3.0
    assert counts["eval/reach-v3/successes"] == 1.0
    assert counts["eval/reach-v3/by/operator"] == 1.0
    assert counts["eval/reach-v3/by/unscored"] == 2.0
    assert "eval/reach-v3/by/driver" not in counts


def test_who_scored_an_episode() -> None:
    assert scored_by("success", "classifier", False, False) == "classifier"
    assert scored_by("failure", "KeyboardOperator", True, True) == "operator"
    assert scored_by("success", "cloud: dashboard", False, False) == "operator"
    assert scored_by(None, "", False, True) == "driver"  # the driver saw no success
    assert scored_by(None, "", True, False) == "driver"
    assert scored_by(None, "", False, False) == "unscored"
