"""Rows of another (or the same) buffer directory mounted as offline data
(``ReplayBuffer.mount``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol

import numpy as np

from buffer.sampling.view import Table
from foundation.rows import RowFilter


class MountedTable(Table, Protocol):
    """A mounted buffer as its view holds it (``buffer.ReplayBuffer`` is one): read, and
    closed when the mounting buffer closes (unless it is that buffer)."""

    def close(self) -> None:
        """Close the buffer (its threads, WAL and directory lock)."""
        ...


@dataclass
class OfflineView:
    """Rows of another (or the same) buffer directory mounted as offline data, not copied.

    Attributes:
        name: for display (the directory by default).
        buffer: the mounted buffer (read-only when it is another directory).
        rows: eligible global row ids of ``buffer`` that passed the filter, ascending.
        filter: the filter used (provenance).
        task: every row counts as this task (None: the rows' own task names).
    """

    name: str
    buffer: MountedTable
    rows: np.ndarray
    filter: RowFilter = field(default_factory=RowFilter)
    task: str | None = None

    def __len__(self) -> int:
        return len(self.rows)

    @cached_property
    def task_names(self) -> list[str]:
        """The tasks its rows count as (``task``, or the rows' own task names), sorted."""
        if self.task is not None:
            return [self.task]
        base, cols = self.buffer.index.frame()
        held = self.rows[self.rows >= base]  # a mount of its own buffer: retention goes on
        codes = np.unique(cols["task"][held - base]) if len(held) else []
        idx = self.buffer.index
        return sorted(idx.tasks.names[int(c)] for c in codes)
