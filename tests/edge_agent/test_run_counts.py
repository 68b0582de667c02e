"""A robot's counts for a run outlive its agent (``edge_agent.run_counts``): the agent a
restarted or re-assigned robot computer builds on the run's spool takes up the success tally
and the human cost where the last one left them, under the same ``tally_epoch``."""

from __future__ import annotations

import errno
import json
import time
from pathlib import Path

from edge_agent import run_counts
from edge_agent.evaluation import EPOCH_KEY
from edge_agent.run_counts import FILE, RunCounts
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


def test_a_long_takeover_is_saved_while_it_lasts(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # A person's seconds are kept every SAVE_EVERY_S, not only at the episode's end: a robot
    # computer that dies in the middle of a long takeover or reset loses at most that much.
    monkeypatch.setattr(run_counts, "SAVE_EVERY_S", 0.05)
    counts = RunCounts(tmp_path, period=0.1)
    counts.step("reach-v3", intervening=True)
    assert not (tmp_path / FILE).exists()  # not due yet
    time.sleep(0.06)
    counts.step("reach-v3", intervening=True)
    saved = json.loads((tmp_path / FILE).read_text())["human"]
    assert saved == {k: v for k, v in counts.human.counts.items()}
    assert any(k.endswith("takeover_s") and v > 0 for k, v in saved.items()), saved
    time.sleep(0.06)
    counts.reset_time(2.0)  # no episode has ended: a reset's seconds are not counted yet
    time.sleep(0.06)
    counts.human.episode("reach-v3", 2, autonomous=False)
    counts.reset_time(3.0)  # a reset after that episode: kept before the person is done
    again = RunCounts(tmp_path, period=0.1)  # the robot computer restarted
    assert again.human.counts == counts.human.counts
    assert again.human.counts["human/reach-v3/reset_s"] == 3.0


def test_a_full_disk_does_not_stop_the_robot_between_saves(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(run_counts, "SAVE_EVERY_S", 0.0)

    def full(path: Path, text: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device (injected)")

    monkeypatch.setattr(run_counts, "atomic_write_text", full)
    counts = RunCounts(tmp_path, period=0.1)
    counts.step("reach-v3", intervening=True)  # logged, not raised: the robot keeps acting
    assert sum(counts.human.counts.values()) > 0
