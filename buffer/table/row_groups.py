"""How the rows of one read of the tiered storage (``buffer.table.storage``) fall apart: into
the chunks that hold them (:func:`chunk_groups`), into runs of consecutive batch positions
that are copied straight into the batch (:func:`runs_of`), and the rows' successors read
beside them where a file read brings both (:class:`Successors`, :func:`read_with_successors`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from buffer.table.chunks import Segment
from buffer.table.tail_reads import WalTailReader


def chunk_groups(ci: np.ndarray) -> list[tuple[int, np.ndarray | None]]:
    """Positions grouped by chunk number ``ci`` (one per row): ``(chunk, positions)``, or
    ``[(chunk, None)]`` when every row is in the same chunk."""
    if ci[0] == ci[-1] and (ci == ci[0]).all():
        return [(int(ci[0]), None)]
    order = np.argsort(ci, kind="stable")
    sorted_ci = ci[order]
    bounds = np.flatnonzero(np.diff(sorted_ci)) + 1
    return [
        (int(sorted_ci[a]), order[a:b])
        for a, b in zip(
            np.concatenate([[0], bounds]), np.concatenate([bounds, [len(ci)]]), strict=True
        )
    ]


@dataclass
class Successors:
    """The successors of the rows a :meth:`buffer.table.storage.TieredStorage.gather` reads, to be read beside them.

    Attributes:
        rows: global rows ``(n,)``, int64, aligned with the gather's rows (a transition's
            next-observation row).
        out: arrays ``(n, ...)`` by column name to fill with those rows' values.
        read: bool ``(n,)``: True where every file-backed column of ``out`` was filled (a
            later gather of ``rows`` passes it as ``skip``).
    """

    rows: np.ndarray
    out: dict[str, np.ndarray]
    read: np.ndarray


def read_with_successors(
    mapped: Segment | WalTailReader,
    name: str,
    first_row: int,
    local: np.ndarray,
    sel: np.ndarray | None,
    out: dict[str, np.ndarray],
    then: Successors,
) -> None:
    """Column ``name`` of one file-backed chunk's ``local`` rows into ``out``, and of each
    row's successor into ``then.out`` in the same read where it lies next to the row."""
    at = np.arange(len(then.rows)) if sel is None else sel
    nxt = then.rows[at] - first_row
    got = mapped.read_rows(name, local, out[name], at=sel, then=(nxt, then.out[name]))
    assert got is not None
    then.read[at] = got


def runs_of(sel: np.ndarray, most: int = 8) -> list[tuple[int, int]] | None:
    """``[(a, b)]``: ``sel[a:b]`` are consecutive positions, the runs covering ``sel`` in
    order; None when ``sel`` falls into more than ``most`` runs (a scatter is then cheaper)."""
    if len(sel) < 2:
        return [(0, len(sel))]
    breaks = np.flatnonzero(np.diff(sel) != 1) + 1
    if len(breaks) >= most:
        return None
    edges = [0, *breaks.tolist(), len(sel)]
    return list(zip(edges[:-1], edges[1:], strict=True))
