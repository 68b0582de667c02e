"""Rows of a fixed-size column copied out of record files with ``preadv``, one call per row,
or per pair of rows where the caller also wants the row after it (a transition's observation
and its next observation lie side by side in the record: one call reads both).

Shared by sealed segments (``buffer.files.sealed.WalSegment``) and the open tail's WAL
stripes (``buffer.table.tail_reads``), whose record tables have the same layout: one int64
row per record with its local first row at column 0, its file at column 1, its row count at
``count`` and each column's row-0 values offset at that column's index.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np

from buffer.errors import CorruptDataError


def read_rows(
    table: np.ndarray,
    count: int,
    column: int,
    fds: Mapping[int, int] | Sequence[int],
    paths: Sequence[str],
    name: str,
    rows: np.ndarray,
    out: np.ndarray,
    at: np.ndarray | None = None,
    then: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray | None:
    """Copy local ``rows`` (int64 ``(n,)``) of column ``name`` into ``out`` (row ``i`` into
    ``out[at[i]]``, or ``out[i]`` when ``at`` is None).

    ``then=(next_rows, next_out)``: where ``next_rows[i] == rows[i] + 1`` in the same record,
    that row is read in the same call into ``next_out`` at the same position.

    Returns:
        With ``then``: bool ``(n,)``, True where the next row was read; else None.

    Raises:
        CorruptDataError: a row has no record, or a read came back short.
    """
    flat = out.reshape(len(out), -1).view(np.uint8)
    nbytes = flat.shape[1]
    rec = np.searchsorted(table[:, 0], rows, side="right") - 1
    if len(rows) and (rec.min() < 0 or (rows >= table[rec, 0] + table[rec, count]).any()):
        raise CorruptDataError(f"{paths[0]}: a row of {name} has no record")
    pos = table[rec, column] + (rows - table[rec, 0]) * nbytes
    files = table[rec, 1].tolist()
    dest = range(len(rows)) if at is None else at.tolist()
    if then is None:
        for i, p, f in zip(dest, pos.tolist(), files, strict=True):
            if os.preadv(fds[f], [flat[i]], p) != nbytes:
                raise CorruptDataError(f"{paths[f]}: short read of {name}")
        return None
    next_rows, next_out = then
    nflat = next_out.reshape(len(next_out), -1).view(np.uint8)
    paired = (next_rows == rows + 1) & (rows + 1 < table[rec, 0] + table[rec, count])
    for i, p, f, two in zip(dest, pos.tolist(), files, paired.tolist(), strict=True):
        bufs, want = ([flat[i], nflat[i]], 2 * nbytes) if two else ([flat[i]], nbytes)
        if os.preadv(fds[f], bufs, p) != want:
            raise CorruptDataError(f"{paths[f]}: short read of {name}")
    return paired
