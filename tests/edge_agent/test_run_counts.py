"""A robot's counts for a run outlive its agent (``edge_agent.run_counts``): the agent a
restarted or re-assigned robot computer builds on the run's spool takes up the success tally
and the human cost where the last one left them, under the same ``tally_epoch``."""

from __future__ import annotations

from pathlib import Path

from edge_agent.evaluation import EPOCH_KEY
from edge_agent.run_counts import FILE
from tests.edge_agent.helpers import BiasPolicy, make_agent
from tests.edge_agent.test_eval_scorers import LabelsFirstEpisode
from tests.fakes.robot import PointRobot
from tests.fakes.settings import fast_edge

EPISODES = "eval/reach-v3/episodes"
LABELS = "human/reach-v3/labels"


def _agent(tmp_path: Path):  # type: ignore[no-untyped-def]
    return make_agent(
        tmp_path,
        PointRobot(episode_steps=5),
        BiasPolicy(),
        operator=LabelsFirstEpisode(),
        settings=fast_edge(evaluate_every_episodes=1),
    )


def test_a_later_agent_of_the_run_counts_on_from_the_last(tmp_path: Path) -> None:
    first = _agent(tmp_path)
    first.run(episodes=3)
    before = first.report()
    first.uplink.close()
    assert (before[EPISODES], before[LABELS]) == (3.0, 1.0)

    second = _agent(tmp_path)  # the same run's spool: a restart or a re-assignment
    resumed = second.report()
    assert resumed[EPOCH_KEY] == before[EPOCH_KEY]
    assert (resumed[EPISODES], resumed[LABELS]) == (3.0, 1.0)
    second.run(episodes=2)
    after = second.report()
    second.uplink.close()
    assert after[EPISODES] == 5.0
    assert after[LABELS] == 2.0  # the second agent's operator labelled its first episode too
    assert after[EPOCH_KEY] == before[EPOCH_KEY]


def test_unreadable_counts_start_again_under_a_new_epoch(tmp_path: Path) -> None:
    first = _agent(tmp_path)
    first.run(episodes=1)
    epoch = first.report()[EPOCH_KEY]
    first.uplink.close()
    spool = tmp_path / "spool"
    (spool / FILE).write_text('{"epoch": "torn')
    second = _agent(tmp_path)
    report = second.report()
    second.uplink.close()
    assert report[EPOCH_KEY] != epoch  # the cloud takes the new counts whole
    assert EPISODES not in report
