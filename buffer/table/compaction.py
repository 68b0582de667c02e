"""Compaction of the row index: it forgets the rows retention deleted.

Retention (``buffer.table.retention``) deletes the oldest segments and records their seqs
(``buffer.table.retired``), but the row index (``buffer.table.index``) would keep ~89 bytes for
every row ever stored: a leak at fleet rates (hundreds of MB an hour). Once the rows below the
storage's first live row are at least a quarter of the index (and :data:`COMPACT_MIN_ROWS`),
they are dropped, so each live row is copied O(1) times amortised; it runs under the buffer's
lock, in numpy slices (the loops are per robot and per open episode, never per row).

After it the index is what a reopen of the directory would build (its base is the first row on
disk): ``prev_row`` links into dropped rows are -1, the robots' seq lists lose their dropped
(oldest) seqs and ``RetiredSeqs.in_index`` loses as many, so the record is the only source of
those seqs (``buffer.table.lookups``); the robots' last rows and episodes left open below the
new base are forgotten; ``discarded_steps`` counts the rows still held. Episode marks
(discards, outcomes) are per episode, not per row, and stay: a reopen applies them all too.
"""

from __future__ import annotations

import numpy as np

from buffer.table.index import RowIndex
from buffer.table.memory import anon_array
from buffer.table.retired import RetiredSeqs
from buffer.table.state import TableState

# Fewer dead rows than this are not worth a copy (89 B each: 16384 rows are ~1.4 MiB).
COMPACT_MIN_ROWS = 1 << 14


def maybe_compact(state: TableState) -> int:
    """Drop the index's rows below the storage's first live row when they are at least a
    quarter of the index and :data:`COMPACT_MIN_ROWS` (read at each call). Call with the
    lock held, after retention removed chunks. Returns the rows dropped (0: not yet)."""
    idx = state.index
    storage = state.storage
    first_live = storage.chunks[0].first_row if storage.chunks else state.visible
    upto = min(first_live, state.visible, idx.end)
    dead = upto - idx.base
    if dead <= 0 or dead < COMPACT_MIN_ROWS or 4 * dead < len(idx):
        return 0
    compact(idx, state.retired, upto)
    return dead


def compact(index: RowIndex, retired: RetiredSeqs, upto: int) -> None:
    """Drop rows ``[index.base, upto)`` (retired rows: retention recorded them in
    ``retired``) from ``index``; see the module docstring. Call with the lock held.

    The live rows move to new arrays (a reader holding the old ``frame()`` keeps a consistent
    pair; the old mappings are unmapped when the last reader lets go), with room for as many
    again before the index grows.

    Raises:
        ValueError: ``upto`` is outside ``[index.base, index.end]``.
    """
    base, old = index.frame()
    if not base <= upto <= index.end:
        raise ValueError(f"cannot drop rows [{base}, {upto}) of [{base}, {index.end})")
    k, n = upto - base, index.end - upto
    if k == 0:
        return
    cap = max(2 * n, 4096)
    cols = {}
    for name, arr in old.items():
        fresh = anon_array((cap,), arr.dtype)
        fresh[:n] = arr[k : k + n]
        cols[name] = fresh
    prev = cols["prev_row"][:n]
    prev[prev < upto] = -1  # a predecessor that is gone, as a reopen links it (none)
    index.discarded_steps -= int(np.count_nonzero(old["discarded"][:k]))
    _drop_seqs(index, retired, np.bincount(old["robot"][:k]))
    index.forget_open_before(upto)
    index.rebase(upto, cols)


def _drop_seqs(index: RowIndex, retired: RetiredSeqs, dropped: np.ndarray) -> None:
    """Drop each robot's oldest ``dropped[code]`` seqs (a robot's seqs are in row order) and
    count them out of ``retired.in_index``."""
    for code in np.flatnonzero(dropped).tolist():
        gone = int(dropped[code])
        rid = index.robots.names[code]
        left = retired.in_index.get(rid, 0) - gone
        if left > 0:
            retired.in_index[rid] = left
        else:
            retired.in_index.pop(rid, None)
        rs = index.robot_seqs.get(code)
        if rs is None:
            continue
        keep = rs.n - gone
        if keep <= 0:
            del index.robot_seqs[code]  # as after a reopen: the index holds none of its rows
            continue
        fresh = anon_array((max(2 * keep, 64),), np.dtype(np.int64))
        fresh[:keep] = rs.seqs[gone : rs.n]
        rs.seqs, rs.n = fresh, keep
