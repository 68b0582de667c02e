"""Episodes the buffer must never serve: an operator's discard / rerecord marks (durable, applied
to rows stored before and after them), and an interrupted episode closed as truncated."""

from __future__ import annotations

import numpy as np
import pytest

from buffer import samplers
from buffer.table.marks import MARKS_FILE
from foundation.rows import RowFilter
from tests.buffer.helpers import episodes, obs_value, open_buffer, step

SAMPLERS = (
    samplers.UniformSampler,
    samplers.PrioritizedSampler,
    lambda: samplers.RecencySampler(window=1000),
    lambda: samplers.InterventionSampler(weight=2.0),
    lambda: samplers.MixSampler(prior="interventions"),
    lambda: samplers.CacheAwareSampler(hot_share=0.5),
)


def _episode_rows(buf, episode: int, robot: str = "robot-0") -> np.ndarray:
    idx = buf.index
    li = np.arange(buf.first_row, buf.visible) - idx.base
    mine = (idx.cols["episode_index"][li] == episode) & (
        idx.cols["robot"][li] == idx.robots.codes[robot]
    )
    return li[mine] + idx.base


def test_a_discarded_episode_is_never_sampled_before_or_after_its_rows(tmp_path):
    rng = np.random.default_rng(1)
    with open_buffer(tmp_path / "b") as buf:
        prioritized = samplers.PrioritizedSampler()
        buf.append(episodes(0, [10, 10, 10]))  # episodes 0, 1, 2
        buf.sample(64, sampler=prioritized, rng=rng)  # every row is in its tree now
        assert buf.mark_episode("robot-0", "run-a", 1, "rerecord") == 10
        # Marked before any of its rows arrive: they are discarded as they come.
        assert buf.mark_episode("robot-0", "run-a", 3) == 0
        buf.append(episodes(0, [10, 10], seq0=30, ep0=3))  # episodes 3, 4
        assert buf.mark_episode("robot-0", "run-a", 3) == 0  # twice: nothing changes
        assert len(buf) == 30 and len(buf.select()) == 30
        for make in [lambda: prioritized, *SAMPLERS]:
            batch = buf.sample(512, sampler=make(), rng=rng)
            assert not np.isin(batch["episode_index"], [1, 3]).any(), make
        stats = buf.stats()
        assert stats["discarded_episodes"] == 2 and stats["rerecorded_episodes"] == 1
        assert stats["discarded_steps"] == 20
        assert buf.index_summary()["discarded_episodes"] == {"discard": 1, "rerecord": 1}
    with open_buffer(tmp_path / "b") as again:  # durable: applied again on open
        assert len(again) == 30
        batch = again.sample(512, rng=rng)
        assert not np.isin(batch["episode_index"], [1, 3]).any()
        assert again.stats()["discarded_steps"] == 20
        mount = again.mount(tmp_path / "b")  # the rows a mount offers leave them out too
        assert not np.isin(again.index.cols["episode_index"][mount.rows], [1, 3]).any()


def test_marks_are_checked_and_a_torn_last_mark_is_dropped(tmp_path):
    with open_buffer(tmp_path / "b") as buf:
        buf.append(episodes(0, [5, 5]))
        with pytest.raises(ValueError, match="unknown episode mark 'keep'"):
            buf.mark_episode("robot-0", "run-a", 0, "keep")
        with pytest.raises(ValueError, match="episode_index"):
            buf.mark_episode("robot-0", "run-a", -1)
        with pytest.raises(ValueError, match="run_id"):
            buf.mark_episode("robot-0", "", 0)
        buf.mark_episode("robot-0", "run-a", 0)
    with open(tmp_path / "b" / MARKS_FILE, "a") as f:
        f.write('{"run_id": "run-a", "robot_id": "robot-0", "episode_')  # a crash mid-line
    with open_buffer(tmp_path / "b") as buf:
        assert len(buf) == 5  # episode 0 still discarded, the torn mark of nothing dropped
        buf.mark_episode("robot-0", "run-a", 1)
        assert len(buf) == 0
    with open_buffer(tmp_path / "b") as buf:
        assert len(buf) == 0 and buf.stats()["discarded_episodes"] == 2


def test_an_interrupted_episode_is_closed_when_its_robot_starts_another(tmp_path):
    # Robot 0's episode 0 ends without a done step (its agent was killed after frame 5);
    # robot 1 interleaves a complete episode; then robot 0 starts episode 1.
    killed = [step(0, s, 0, s) for s in range(6)]
    with open_buffer(tmp_path / "b") as buf:
        buf.append(killed[:3])
        buf.append(episodes(1, [4]))
        buf.append(killed[3:])
        ep0 = _episode_rows(buf, 0)
        assert not buf.index.cols["truncated"][ep0 - buf.index.base].any()  # still open
        buf.append(episodes(0, [4], seq0=6, ep0=1))
        _check_closed(buf)
    with open_buffer(tmp_path / "b") as buf:  # the rows alone rebuild the same index
        _check_closed(buf)
        assert buf.stats()["interrupted_episodes"] == 1


def _check_closed(buf) -> None:
    idx = buf.index
    ep0 = _episode_rows(buf, 0)
    li = ep0 - idx.base
    assert idx.cols["truncated"][li].tolist() == [False] * 4 + [True, False]
    assert idx.cols["eligible"][li].tolist() == [True] * 5 + [False]
    got = buf.read_transitions(ep0[4:5], count=False)
    assert got["truncated"][0] and not got["terminated"][0]
    # Its next observation is the last stored step's observation (frame 5).
    assert got["next.observation.state"][0].tolist() == [obs_value(0, 5)] * 3
    seq = buf.read_sequences(ep0[3:4], 4, 0)
    assert seq["mask"][0].tolist() == [True, True, False, False]  # ends at the done step
    assert seq["next.observation.state"][0].tolist() == [obs_value(0, 5)] * 3
    other = _episode_rows(buf, 0, "robot-1") - idx.base  # another robot's: untouched
    assert idx.cols["terminated"][other].tolist() == [False] * 3 + [True]
    assert not idx.cols["truncated"][other].any()


def test_outcome_marks_label_episodes_without_excluding_them(tmp_path):
    """success / failure marks exclude nothing; success_only selects and mounts the rows of
    successful episodes, stored before or after the mark, and survives a reopen."""
    with open_buffer(tmp_path / "b") as buf:
        buf.append(episodes(0, [4, 4, 4]))  # episodes 0, 1, 2 (12 transitions)
        assert buf.mark_episode("robot-0", "run-a", 0, "success") == 4
        assert buf.mark_episode("robot-0", "run-a", 0, "success") == 0  # unchanged
        assert buf.mark_episode("robot-0", "run-a", 2, "failure") == 4
        assert buf.mark_episode("robot-0", "run-a", 3, "success") == 0  # its rows come later
        buf.append(episodes(0, [4], seq0=12, ep0=3))
        assert len(buf) == 16  # nothing excluded
        eps = buf.index.cols["episode_index"][
            buf.select(RowFilter(success_only=True)) - buf.index.base
        ]
        assert sorted(set(eps.tolist())) == [0, 3] and len(eps) == 8
        assert buf.stats()["successful_episodes"] == 2
        summary = buf.index_summary()
        assert summary["successful_episodes"] == 2 and summary["failed_episodes"] == 1
        assert buf.mark_episodes([("robot-0", "run-a", 0, "failure")]) == 4  # latest counts
        assert len(buf.select(RowFilter(success_only=True))) == 4
        with pytest.raises(ValueError, match="unknown episode mark"):
            buf.mark_episodes([("robot-0", "run-a", 1, "success"), ("robot-0", "run-a", 1, "x")])
        assert buf.index.outcomes.get(("run-a", "robot-0", 1)) is None  # checked before any
    with open_buffer(tmp_path / "b") as again:
        assert len(again) == 16
        view = again.mount(tmp_path / "b", RowFilter(success_only=True), name="won")
        rows = view.rows - view.buffer.index.base
        assert set(view.buffer.index.cols["episode_index"][rows].tolist()) == {3}
        assert view.filter.success_only is True and view.filter.time_range is None


def test_time_range_selects_steps_by_their_timestamp(tmp_path):
    with open_buffer(tmp_path / "b") as buf:
        buf.append(episodes(0, [6, 6]))  # timestamps frame / 10
        rows = buf.select(RowFilter(time_range=(0.1, 0.3)))
        frames = buf.index.cols["frame_index"][rows - buf.index.base]
        assert sorted(frames.tolist()) == [1, 1, 2, 2, 3, 3]
        view = buf.mount(buf, RowFilter(time_range=(0.0, 0.0), interventions_only=False))
        assert len(view) == 2 and view.filter.time_range == (0.0, 0.0)
        with pytest.raises(ValueError, match="before the start"):
            buf.select(RowFilter(time_range=(1.0, 0.5)))
