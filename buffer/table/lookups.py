"""Per-robot lookups over durable rows (acknowledged, i.e. fdatasynced): what the uplink's
re-sync and the run's accounting ask (``ReplayBuffer.durable_seq``, ``stored_seqs``,
``contains``, ``retired_seqs``).

A robot's durable seqs are those the row index holds plus those retention deleted
(``TableState.retired``, the directory's record); rows retired but not yet dropped from the
index by compaction (``buffer.table.compaction``) are in both, as the oldest of the robot's
index seqs (``RetiredSeqs.in_index``).
"""

from __future__ import annotations

import numpy as np

from buffer.table.state import TableState


def durable_seqs(st: TableState, robot_id: str | int) -> np.ndarray:
    """View of the robot's durable seqs in the row index, ascending (call with the lock
    held); seqs the index dropped (or retired before this open) are not among them.

    A robot's seqs enter the index in row order, and only rows ``>= visible`` are still
    waiting for their fdatasync, so the durable ones are a prefix of its seq list.
    """
    idx = st.index
    code = idx.robots.codes.get(str(robot_id))
    if code is None:
        return np.empty(0, dtype=np.int64)
    rs = idx.robot_seqs.get(code)
    if rs is None or rs.n == 0:
        return np.empty(0, dtype=np.int64)
    n = rs.n
    if idx.robot_last_row.get(code, -1) >= st.visible:
        b = idx.base
        n -= int(np.count_nonzero(idx.cols["robot"][st.visible - b : idx.end - b] == code))
    return rs.seqs[:n]


def stored_now(st: TableState, robot_id: str | int) -> np.ndarray:
    """View of the robot's durable seqs whose rows are still on disk, ascending."""
    seqs = durable_seqs(st, robot_id)
    return seqs[min(st.retired.in_index.get(str(robot_id), 0), len(seqs)) :]


def stored_seqs(st: TableState, robot_id: str | int, retired: bool = True) -> np.ndarray:
    """New int64 array (n,), ascending: the robot's durable seqs, with those retention
    deleted when ``retired`` (call with the lock held)."""
    now = stored_now(st, robot_id)
    if not retired:
        return now.copy()
    gone = st.retired.seqs(str(robot_id))
    if not len(gone):
        return now.copy()
    return np.sort(np.concatenate([gone, now]), kind="stable")


def last_seq(st: TableState, robot_id: str | int) -> int | None:
    """The robot's highest durable seq, retired or not, or None (call with the lock held)."""
    seqs = durable_seqs(st, robot_id)
    gone = st.retired.last(str(robot_id))
    have = [int(seqs[-1])] if len(seqs) else []
    return max(have + ([gone] if gone is not None else []), default=None)


def contains(st: TableState, robot_id: str | int, q: np.ndarray) -> np.ndarray:
    """Which of int64 ``q`` (shape (n,)) are durable seqs of ``robot_id``, retired ones
    included (bool, shape (n,)); binary search (call with the lock held)."""
    out = st.retired.contains(str(robot_id), q)
    have = durable_seqs(st, robot_id)
    if len(have):
        pos = np.minimum(np.searchsorted(have, q), len(have) - 1)
        out |= have[pos] == q
    return np.asarray(out, dtype=bool)
