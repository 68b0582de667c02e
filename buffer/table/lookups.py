"""Per-robot lookups over durable rows (acknowledged, i.e. fdatasynced): what the uplink's
re-sync and the run's accounting ask (``ReplayBuffer.durable_seq``, ``stored_seqs``,
``contains``)."""

from __future__ import annotations

import numpy as np

from buffer.table.state import TableState


def durable_seqs(st: TableState, robot_id: str | int) -> np.ndarray:
    """View of the robot's durable seqs, ascending (call with the lock held).

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


def contains(st: TableState, robot_id: str | int, q: np.ndarray) -> np.ndarray:
    """Which of int64 ``q`` (shape (n,)) are durable seqs of ``robot_id`` (bool, shape (n,));
    binary search (call with the lock held)."""
    have = durable_seqs(st, robot_id)
    if not len(have):
        return np.zeros(len(q), dtype=bool)
    pos = np.minimum(np.searchsorted(have, q), len(have) - 1)
    return np.asarray(have[pos] == q, dtype=bool)
