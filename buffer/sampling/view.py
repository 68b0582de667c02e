"""What a sampler sees of a buffer: a :class:`SamplingView` of the online window and the mounted
offline :class:`Source` s, with accessors for their per-row index columns.

Samplers (``buffer.sampling.samplers``) read only this module's types; the buffer behind a view is any
:class:`Table` (``buffer.ReplayBuffer`` is one), so samplers never depend on the buffer class.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from buffer.table.index import Frame, RowIndex


class Table(Protocol):
    """What a sampling view and a batch read of one buffer (``buffer.ReplayBuffer``)."""

    @property
    def index(self) -> RowIndex:
        """The row index (per-row scalar columns, task/robot/run codes)."""
        ...

    def hot_ranges(self) -> list[tuple[int, int]]:
        """Global row ranges ``[first, first + capacity)`` of the chunks held in RAM."""
        ...

    def read_transitions(self, rows: np.ndarray, *, count: bool = True) -> dict[str, np.ndarray]:
        """Transitions at global ``rows`` (see ``ReplayBuffer.sample`` for the keys)."""
        ...

    def read_sequences(
        self, starts: np.ndarray, length: int, history: int
    ) -> dict[str, np.ndarray]:
        """Sequences starting at global ``starts`` (see ``ReplayBuffer.sample_sequences``)."""
        ...

    def read_action_chunks(self, starts: np.ndarray, length: int) -> dict[str, np.ndarray]:
        """Action chunks starting at global ``starts`` (see ``ReplayBuffer.sample_chunks``)."""
        ...


@dataclass
class Source:
    """Where picked rows come from: a buffer and (for offline views) its allowed rows.

    Attributes:
        buffer: the buffer the rows belong to.
        rows: eligible global rows an offline view allows (ascending, int64), None for the
            online window.
        name: for display.
        source_id: 0 online, k for the k-th mounted offline view (the batch's ``source``).
        task: an offline view's rows all count as this task (its own task names are not
            the run's); None: their own task names.
        tasks: an offline view's task names that its rows have (None: every task its
            buffer has seen).
        frame: the buffer's index ``(base, cols)`` as taken with the view (``RowIndex.frame``:
            compaction may move the base meanwhile); None: the index's current one.
    """

    buffer: Table
    rows: np.ndarray | None
    name: str
    source_id: int = 0
    task: str | None = None
    tasks: list[str] | None = None
    frame: Frame | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.frame is None:
            self.frame = self.buffer.index.frame()

    @property
    def base(self) -> int:
        """Global row of index position 0 (``column(name)[row - base]``); rows below it
        are gone (retention deleted them and the index dropped them)."""
        assert self.frame is not None
        return self.frame[0]

    def column(self, name: str) -> np.ndarray:
        """The index column ``name`` of this source's buffer (of :attr:`frame`; appends
        still change its flags), indexed by ``row - base``:
        bool flags (``eligible``, ``is_intervention``, ``terminated``, ``truncated``), int32
        codes (``task``, ``robot``, ``run``; see :meth:`task_code`), int64 ``episode_index``,
        ``frame_index``, ``policy_version``. Appends may grow it; slice what you need once."""
        assert self.frame is not None
        return self.frame[1][name]

    def task_code(self, task: str) -> int | None:
        """The ``task`` column's code of ``task`` in this source's buffer (None: never seen)."""
        return self.buffer.index.tasks.codes.get(task)

    def task_names(self) -> list[str]:
        """Every task name this source's buffer has seen (position = code), or its one
        ``task`` when it has one."""
        if self.task is not None:
            return [self.task]
        if self.tasks is not None:
            return list(self.tasks)
        return list(self.buffer.index.tasks.names)

    def task_rows(self, task: str | None) -> np.ndarray:
        """This offline source's allowed rows of ``task`` (all of them for None); empty for
        the online window (it has no row list)."""
        rows = self.rows if self.rows is not None else np.empty(0, dtype=np.int64)
        if task is None or len(rows) == 0:
            return rows
        if self.task is not None:
            return rows if task == self.task else np.empty(0, dtype=np.int64)
        code = self.task_code(task)
        if code is None:
            return np.empty(0, dtype=np.int64)
        rows = rows[rows >= self.base]  # a mount of its own buffer: retention goes on
        return rows[self.column("task")[rows - self.base] == code]


class SamplingView:
    """What a sampler sees: the online window ``[lo, hi)`` and the mounted offline sources.

    Args:
        buffer: the buffer whose window this is.
        lo, hi: the window's global rows (``ReplayBuffer.window``).
        offline: the mounted offline sources; their ``source_id`` is set to 1, 2, ... here.
        frame: ``buffer``'s index ``(base, cols)`` taken with the window, so that
            ``base <= lo`` (default: the index's current one).
    """

    def __init__(
        self,
        buffer: Table,
        lo: int,
        hi: int,
        offline: list[Source],
        frame: Frame | None = None,
    ) -> None:
        self.buffer = buffer
        self.lo = lo
        self.hi = hi
        self.online = Source(buffer, None, "online", 0, frame=frame)
        self.offline = offline
        for i, s in enumerate(offline):
            s.source_id = i + 1

    @property
    def eligible(self) -> np.ndarray:
        """The live ``eligible`` column, indexed by ``row - base`` (see :meth:`column`)."""
        return self.online.column("eligible")

    @property
    def base(self) -> int:
        return self.online.base

    def column(self, name: str) -> np.ndarray:
        """The online buffer's live index column ``name``, indexed by ``row - base`` (see
        :meth:`Source.column`): for accept masks over the window."""
        return self.online.column(name)

    def window_column(self, name: str) -> np.ndarray:
        """Column ``name`` for the window's rows: shape ``(hi - lo,)``, position ``row - lo``.
        A view of the live column: read each column once per draw and draw from what was read
        (appends change flags such as ``eligible`` meanwhile)."""
        return self.column(name)[self.lo - self.base : self.hi - self.base]

    def task_code(self, task: str) -> int | None:
        """The online buffer's code of ``task`` in the ``task`` column (None: never seen)."""
        return self.online.task_code(task)

    def task_names(self, *, online: bool = True, offline: bool = True) -> list[str]:
        """Task names seen by the online buffer and/or the offline sources, sorted."""
        names: set[str] = set(self.online.task_names()) if online else set()
        if offline:
            for s in self.offline:
                names.update(s.task_names())
        return sorted(names)

    def hot_ranges(self) -> list[tuple[int, int]]:
        """Row ranges held in RAM, clipped to the window."""
        out = []
        for first, end in self.buffer.hot_ranges():
            lo, hi = max(first, self.lo), min(end, self.hi)
            if hi > lo:
                out.append((lo, hi))
        return out


Picks = list[tuple[Source, np.ndarray, np.ndarray]]
