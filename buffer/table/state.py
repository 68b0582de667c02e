"""The state every part of one buffer shares: its lock, the row index, the tiered storage and
the visible watermark.

The parts (``buffer.table.writer``, ``buffer.table.sealer``, ``buffer.table.retention``, ``buffer.table.reading``,
``buffer.table.recovery``) each own their own fields and meet here: every field below is read and
written under ``lock``, and ``cond`` (on the same lock) is where a part waits for rows to
become durable, visible or sealed and where it wakes the others.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa

from buffer.columns import StepColumns
from buffer.config import BufferSettings
from buffer.table.index import RowIndex
from buffer.table.retired import RetiredSeqs
from buffer.table.schema import StepSchema
from buffer.table.storage import TieredStorage


class TableState:
    """Shared state of one open buffer directory.

    Attributes:
        directory, schema, settings, read_only: as given to ``ReplayBuffer.open``.
        lock: the buffer's lock (re-entrant); ``cond`` is a condition on it.
        storage: payload chunks, hot and cold (``buffer.table.storage``).
        index: the row index (``buffer.table.index``); recovery replaces it while opening.
        visible: every row below it is durable (fdatasynced) and readable; rows become
            visible in row order.
        transitions_inserted: transitions that became eligible since open (rate limiting).
        closed: set by ``close``; appends refuse from then on.
        stop: tells the background threads to finish.
        rows_per_segment: rows of an open tail (and of the spare tail the sealer prepares).
        retired: the seqs retention deleted, from the directory's record (``buffer.table.retired``).
    """

    def __init__(
        self, directory: Path, schema: StepSchema, settings: BufferSettings, read_only: bool
    ) -> None:
        self.directory = directory
        self.schema = schema
        self.settings = settings
        self.read_only = read_only
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.storage = TieredStorage(
            schema, settings.memory_budget_bytes, settings.hot_fraction, self.lock
        )
        self.index = RowIndex()
        self.visible = 0
        self.retired = RetiredSeqs(directory, read_only)
        self.transitions_inserted = 0
        self.closed = False
        self.stop = threading.Event()
        row = max(self.storage.row_bytes, 1)
        hot_rows = max(1, int(self.storage.hot_limit // 4 // row))
        target_rows = max(1, settings.segment_target_bytes // row)
        self.rows_per_segment = max(1, min(hot_rows, target_rows))

    def index_rows(self, batch: pa.RecordBatch | StepColumns) -> tuple[int, int]:
        """Index ``batch`` (or its small columns) as the next rows; returns their range
        ``[first, end)`` (``RowIndex.add``)."""
        return self.index.add(batch)
