"""The episodes people labelled: rows of episodes whose outcome mark a person gave.

A run whose reward comes from a classifier (``reward.source: classifier``) trains it on the
episodes an operator judged: the outcome marks (``buffer.table.marks``) whose ``reason`` names
a person (the operator's class name, ``cloud: <actor>``). Outcomes the robot's driver reported
(``driver``), the classifier proposed (``classifier``) or that name nobody (marks stored
without a reason) are no labels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from buffer.table.index import EpisodeKey
from buffer.table.replay_buffer import ReplayBuffer

NOT_A_PERSON = ("", "driver", "classifier")


def is_person(reason: str) -> bool:
    """Whether an outcome mark's ``reason`` names a person (see the module docstring)."""
    return reason not in NOT_A_PERSON


@dataclass(frozen=True)
class LabelledRows:
    """One labelled episode's rows, in step order.

    Attributes:
        key: ``(run_id, robot_id, episode_index)``.
        verdict: ``success`` or ``failure`` (its latest outcome mark).
        reason: who gave it.
        task: the episode's task name.
        rows: its eligible global rows in the buffer's window, ascending ``frame_index``.
    """

    key: EpisodeKey
    verdict: str
    reason: str
    task: str
    rows: np.ndarray


def labelled_episodes(buffer: ReplayBuffer, run_id: str | None = None) -> list[LabelledRows]:
    """Episodes of ``run_id`` (None: any run) in the buffer's window whose outcome a person
    gave, with their rows (episodes without a stored row left out), ordered by key."""
    index = buffer.index
    with buffer.state.lock:
        labels = [
            (key, index.outcomes[key], index.outcome_by.get(key, ""))
            for key in sorted(index.outcomes)
            if is_person(index.outcome_by.get(key, "")) and run_id in (None, key[0])
        ]
        lo, hi = buffer.window()
        a, b = lo - index.base, hi - index.base
        cols = {k: index.cols[k][a:b].copy() for k in ("run", "robot", "episode_index", "task")}
        eligible = index.cols["eligible"][a:b].copy()
        frames = index.cols["frame_index"][a:b].copy()
        runs, robots = dict(index.runs.codes), dict(index.robots.codes)
        tasks = list(index.tasks.names)
    out = []
    for key, verdict, reason in labels:
        run, robot = runs.get(key[0]), robots.get(key[1])
        if run is None or robot is None:
            continue
        mine = (
            eligible
            & (cols["run"] == run)
            & (cols["robot"] == robot)
            & (cols["episode_index"] == key[2])
        )
        local = np.flatnonzero(mine)
        if not len(local):
            continue
        local = local[np.argsort(frames[local], kind="stable")]
        task = tasks[int(cols["task"][local[0]])]
        out.append(LabelledRows(key, verdict, reason, task, local.astype(np.int64) + lo))
    return out


@dataclass(frozen=True)
class PolicyEpisodeRows:
    """One ended episode a policy acted in, its rows in step order.

    Attributes:
        key: ``(run_id, robot_id, episode_index)``.
        failed: a person's failure verdict ended it.
        task: the episode's task name.
        rows: its eligible global rows in the buffer's window, ascending ``frame_index``.
    """

    key: EpisodeKey
    failed: bool
    task: str
    rows: np.ndarray


def recent_policy_episodes(buffer: ReplayBuffer, limit: int) -> list[PolicyEpisodeRows]:
    """The latest ``limit`` ended episodes of the window in which a policy acted (a row with
    ``policy_version >= 1``: no demonstration nor offline episode), oldest first: what a
    help probe (``cloud_learner.help_probe``) learns from."""
    index = buffer.index
    with buffer.state.lock:
        lo, hi = buffer.window()
        a, b = lo - index.base, hi - index.base
        names = ("run", "robot", "episode_index", "task", "frame_index", "policy_version")
        cols = {k: index.cols[k][a:b].copy() for k in names}
        done = index.cols["terminated"][a:b] | index.cols["truncated"][a:b]
        eligible = index.cols["eligible"][a:b].copy()
        runs, robots = list(index.runs.names), list(index.robots.names)
        tasks = list(index.tasks.names)
        outcomes = {k: (v, index.outcome_by.get(k, "")) for k, v in index.outcomes.items()}
    local = np.flatnonzero(eligible)
    if not len(local):
        return []
    keys = np.stack([cols["run"][local], cols["robot"][local], cols["episode_index"][local]], 1)
    groups, inverse = np.unique(keys, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    last = np.full(len(groups), -1, np.int64)
    np.maximum.at(last, inverse, local)  # the group's latest row
    out: list[PolicyEpisodeRows] = []
    for g in np.argsort(last)[::-1]:
        mine = local[inverse == g]
        mine = mine[np.argsort(cols["frame_index"][mine], kind="stable")]
        if not done[mine[-1]] or not (cols["policy_version"][mine] >= 1).any():
            continue
        run, robot, ep = (int(x) for x in groups[g])
        key = (runs[run], robots[robot], ep)
        verdict, by = outcomes.get(key, ("", ""))
        failed = verdict == "failure" and is_person(by)
        task = tasks[int(cols["task"][mine[0]])]
        out.append(PolicyEpisodeRows(key, failed, task, mine.astype(np.int64) + lo))
        if len(out) >= limit:
            break
    return out[::-1]
