"""Episodes as a person views them: each stored episode's summary, one episode's steps in
order, and one camera frame of one step (the dashboard's episode viewer).

Every read covers the rows still stored (``[first_row, visible)``), discarded ones included,
under the table's lock for the index and through the storage's snapshot for payloads, so it
is safe beside the buffer's writer in the same process. Rows that retention deleted are
absent: an episode whose first stored step has ``frame_index > 0`` lost that many steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from buffer.errors import SegmentGoneError
from buffer.table.index import EpisodeKey
from buffer.table.replay_buffer import ReplayBuffer

_SCALARS = ("timestamp", "reward", "is_intervention", "policy_version", "frame_index")


@dataclass(frozen=True)
class EpisodeSummary:
    """One stored episode.

    Attributes:
        key: ``(run_id, robot_id, episode_index)``.
        task: its task name.
        steps: its steps still stored.
        first_frame: the ``frame_index`` of its first stored step (> 0: retention deleted
            the steps before it).
        interventions: its stored steps a person acted in.
        label: ``discard`` / ``rerecord`` (excluding marks win), else ``success`` /
            ``failure``, else empty.
        label_by: who gave the outcome label (the mark's reason; empty for a discard).
        last_row: its latest stored global row (orders episodes newest first).
        done: its last stored step ended it (terminated or truncated).
        last_time: its last stored step's ``timestamp`` (s, the robot's clock).
    """

    key: EpisodeKey
    task: str
    steps: int
    first_frame: int
    interventions: int
    label: str
    label_by: str
    last_row: int
    done: bool
    last_time: float


def _stored(buffer: ReplayBuffer) -> tuple[int, int, int]:
    """``(lo, hi, base)``: global rows still stored and the index's base. Caller holds the lock."""
    index = buffer.index
    lo = max(
        buffer.storage.chunks[0].first_row if buffer.storage.chunks else buffer.visible, index.base
    )
    return lo, buffer.visible, index.base


def summaries(buffer: ReplayBuffer, run_id: str) -> list[EpisodeSummary]:
    """Every stored episode of ``run_id``, newest (latest stored row) first."""
    index = buffer.index
    with buffer.state.lock:
        lo, hi, base = _stored(buffer)
        run = index.runs.codes.get(run_id)
        if run is None or hi <= lo:
            return []
        a, b = lo - base, hi - base
        names = (
            "run",
            "robot",
            "episode_index",
            "task",
            "frame_index",
            "is_intervention",
            "timestamp",
        )
        cols = {k: index.cols[k][a:b].copy() for k in names}
        done = (index.cols["terminated"][a:b] | index.cols["truncated"][a:b]).copy()
        robots, tasks = list(index.robots.names), list(index.tasks.names)
        outcomes = {k: (v, index.outcome_by.get(k, "")) for k, v in index.outcomes.items()}
        discards = dict(index.discards)
    local = np.flatnonzero(cols["run"] == run)
    if not len(local):
        return []
    keys = np.stack([cols["robot"][local], cols["episode_index"][local]], 1)
    groups, inverse = np.unique(keys, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    out = []
    for g, (robot, ep) in enumerate(groups.tolist()):
        mine = local[inverse == g]
        frames = cols["frame_index"][mine]
        key = (run_id, robots[robot], int(ep))
        label, by = outcomes.get(key, ("", ""))
        if key in discards:
            label, by = discards[key], ""
        out.append(
            EpisodeSummary(
                key=key,
                task=tasks[int(cols["task"][mine[0]])],
                steps=len(mine),
                first_frame=int(frames.min()),
                interventions=int(np.count_nonzero(cols["is_intervention"][mine])),
                label=label,
                label_by=by,
                last_row=int(mine.max()) + lo,
                done=bool(done[mine[np.argmax(frames)]]),
                last_time=float(cols["timestamp"][mine[np.argmax(frames)]]),
            )
        )
    out.sort(key=lambda e: e.last_row, reverse=True)
    return out


def episode_rows(buffer: ReplayBuffer, key: EpisodeKey) -> np.ndarray:
    """The stored global rows of episode ``key``, ascending ``frame_index`` (int64, shape
    (n,); empty when none is stored)."""
    index = buffer.index
    with buffer.state.lock:
        lo, hi, base = _stored(buffer)
        run, robot = index.runs.codes.get(key[0]), index.robots.codes.get(key[1])
        if run is None or robot is None or hi <= lo:
            return np.empty(0, np.int64)
        a, b = lo - base, hi - base
        mine = np.flatnonzero(
            (index.cols["run"][a:b] == run)
            & (index.cols["robot"][a:b] == robot)
            & (index.cols["episode_index"][a:b] == key[2])
        )
        frames = index.cols["frame_index"][a:b][mine]
    return (mine[np.argsort(frames, kind="stable")] + lo).astype(np.int64)


def read_steps(
    buffer: ReplayBuffer, rows: np.ndarray, features: list[str]
) -> dict[str, np.ndarray]:
    """``features`` (payload columns, e.g. ``observation.state``, ``action``) and the scalar
    columns ``timestamp``, ``reward``, ``is_intervention``, ``policy_version``,
    ``frame_index`` of global ``rows`` (from :func:`episode_rows`): arrays ``(n, ...)``.

    Raises:
        KeyError: a feature the buffer's schema lacks.
        SegmentGoneError: retention deleted a row's segment meanwhile (read the rows again).
    """
    missing = [f for f in features if f not in buffer.schema.payload]
    if missing:
        raise KeyError(f"the buffer has no feature {missing[0]!r}")
    out = buffer.storage.gather(rows, features, count=False)
    with buffer.state.lock:
        base, cols = buffer.index.frame()
        if len(rows) and int(rows.min()) < base:  # compaction dropped them after the gather
            raise SegmentGoneError(f"row {int(rows.min())} was deleted by retention")
        li = rows - base
        for k in _SCALARS:
            out[k] = cols[k][li].copy()
    return out
