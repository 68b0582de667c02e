"""Every row a run's buffer ever held, as its sealed segments and its record of what
retention deleted showed them, and the steps count.

The bench reads each sealed segment once, soon after it appears (``robot_id``, ``seq``,
``policy_version`` of its rows), and the buffer's record of deleted segments
(``buffer.table.retired``: written before each unlink, so no deleted segment escapes it): a row
whose segment is gone at the end was deleted by retention, not lost. Rows are keyed by their
global row number (a segment holds ``[first_row, first_row + rows)``), so one row seen in two
files (a seal finished after a crash) is one row; two rows with one robot's ``seq`` are a step
stored twice. Rows in no segment read nor recorded are counted as ``rows_unseen``: they would
show as lost, so that figure (0 while the record is kept) says how far to trust the count.
Retention folds the record now and then (one line per robot, no rows named): a segment sealed,
deleted and folded between two scans is then among the unseen rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from buffer.errors import CorruptDataError
from buffer.files.sealed import WalSegment, list_sealed
from buffer.files.segments import list_segments
from buffer.table.opening import SCHEMA_FILE
from buffer.table.retired import FOLDED_ROW, RETIRED_FILE, read_lines
from buffer.table.schema import StepSchema

COLUMNS = ["robot_id", "seq", "policy_version"]


@dataclass(frozen=True)
class SegmentRows:
    """The scanned columns of one segment: robot ids (str), seqs and policy versions (int64;
    -1: not known, a segment known from the retention record only)."""

    robot: np.ndarray
    seq: np.ndarray
    version: np.ndarray


def _arrays(batch: pa.RecordBatch | pa.Table) -> SegmentRows:
    return SegmentRows(
        np.asarray(batch.column("robot_id").to_pylist(), dtype=object).astype(str),
        np.asarray(batch.column("seq").to_numpy(zero_copy_only=False), dtype=np.int64),
        np.asarray(batch.column("policy_version").to_numpy(zero_copy_only=False), dtype=np.int64),
    )


class SegmentLedger:
    """The sealed segments of one buffer directory, each read once (:meth:`scan`)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.rows: dict[tuple[int, int], SegmentRows] = {}  # (first row, rows) -> its rows
        self._failed: set[tuple[int, int]] = set()  # segments that broke or vanished on read
        self._schema: pa.Schema | None = None

    @property
    def unreadable(self) -> int:
        """Segments that vanished (or broke) before they were read and that the retention
        record does not hold either."""
        return len(self._failed - set(self.rows))

    def _arrow_schema(self) -> pa.Schema | None:
        if self._schema is None and (self.directory / SCHEMA_FILE).exists():
            text = (self.directory / SCHEMA_FILE).read_text()
            self._schema = StepSchema.from_json(text).arrow_schema
        return self._schema

    def on_disk(self) -> set[tuple[int, int]]:
        """The segments in the directory now."""
        if not self.directory.is_dir():
            return set()
        found = {(first, n) for first, n, _ in list_segments(self.directory)}
        return found | set(list_sealed(self.directory))

    def scan(self) -> int:
        """Read the segments not read yet, then the retention record (segments deleted
        meanwhile); returns how many segments were read."""
        schema = self._arrow_schema()
        if schema is None or not self.directory.is_dir():
            return 0
        new = 0
        arrow = {(f, n): p for f, n, p in list_segments(self.directory)}
        sealed = list_sealed(self.directory)
        for key in sorted((set(arrow) | set(sealed)) - set(self.rows)):
            try:
                if key in arrow:
                    with pa.memory_map(str(arrow[key])) as src:
                        table = ipc.open_file(src).read_all().select(COLUMNS)
                    self.rows[key] = _arrays(table)
                else:
                    seg = WalSegment(sealed[key], key[0], key[1], schema)
                    self.rows[key] = _arrays(seg.scalar_batch(COLUMNS))
                new += 1
            except (OSError, CorruptDataError):  # deleted by retention while being read
                self._failed.add(key)
        self.read_record()
        return new

    def read_record(self) -> None:
        """Add the segments of the buffer's retention record not read from disk: each
        robot's rows are its recorded seqs (a seq stored twice in a segment, the record's row
        count above its distinct seqs, repeats the segment's last seq of that robot)."""
        for line in read_lines(self.directory / RETIRED_FILE):
            key = (line["first_row"], line["rows"])
            if key in self.rows or line["first_row"] == FOLDED_ROW:
                continue  # a folded line names no rows: its segments show as unseen
            robots: list[np.ndarray] = []
            seqs: list[np.ndarray] = []
            for rid, v in line["robots"].items():
                mine = [np.arange(a, b + 1, dtype=np.int64) for a, b in v["seqs"]]
                got = np.concatenate(mine) if mine else np.empty(0, dtype=np.int64)
                extra = max(int(v["rows"]) - len(got), 0)
                if extra and len(got):
                    got = np.concatenate([got, np.full(extra, got[-1], dtype=np.int64)])
                seqs.append(got)
                robots.append(np.full(len(got), rid, dtype=object).astype(str))
            seq = np.concatenate(seqs) if seqs else np.empty(0, dtype=np.int64)
            robot = np.concatenate(robots) if robots else np.empty(0, dtype=str)
            self.rows[key] = SegmentRows(robot, seq, np.full(len(seq), -1, dtype=np.int64))

    def unseen(self) -> list[tuple[int, int]]:
        """Row ranges ``[start, end)`` below the highest row read that no read segment covered
        (segments sealed and deleted between two scans)."""
        gaps, end = [], 0
        for first, n in sorted(self.rows):
            if first > end:
                gaps.append((end, first))
            end = max(end, first + n)
        return gaps

    def rows_unseen(self) -> int:
        """How many rows :meth:`unseen` holds."""
        return sum(b - a for a, b in self.unseen())


@dataclass(frozen=True)
class StepCount:
    """One robot's steps in one run.

    Attributes:
        acked: steps its spools say were acknowledged.
        stored: of them, those whose row is in the buffer at the end.
        retention_deleted: of them, those whose row retention deleted.
        lost: of them, those with no row, stored or deleted, that no unseen row range could
            have held (the robot's rows before and after them were read with none between).
        unverified: of them, those missing where an unseen row range could have held them.
        stored_twice: rows beyond the first of one seq (in the buffer or deleted).
        unacked_rows: rows of seqs not acknowledged (the ack did not reach the robot).
        versions: distinct policy versions its rows were acted with (``0``: before any).
        last_version: the newest of them.
    """

    acked: int
    stored: int
    retention_deleted: int
    lost: int
    unverified: int
    stored_twice: int
    unacked_rows: int
    versions: int
    last_version: int


def count_steps(
    ledger: SegmentLedger,
    on_disk: set[tuple[int, int]],
    acked: Mapping[str, np.ndarray],
    stored: Mapping[str, np.ndarray],
) -> dict[str, StepCount]:
    """Per robot (the buffer's ``robot_id``) of ``acked`` (its acknowledged seqs, repeats for a
    seq acknowledged twice): its :class:`StepCount`. ``stored``: each robot's seqs in the
    buffer at the end (``ReplayBuffer.stored_seqs`` of the closed buffer, reopened: its sealed
    segments and any write-ahead log left, ``retired=False``); ``on_disk``: the segments left at the end (the
    ledger's others were deleted by retention)."""
    out: dict[str, StepCount] = {}
    empty = np.empty(0, dtype=np.int64)
    for key, acked_seqs in sorted(acked.items()):
        now_rows: list[np.ndarray] = []
        gone_rows: list[np.ndarray] = []
        versions: list[np.ndarray] = []
        for (first, n), rows in ledger.rows.items():
            mine = rows.robot == key
            if not mine.any():
                continue
            at = np.arange(first, first + n, dtype=np.int64)[mine]
            pairs = np.stack([at, rows.seq[mine]], axis=1)
            (now_rows if (first, n) in on_disk else gone_rows).append(pairs)
            versions.append(rows.version[mine])
        kept = _unique_rows(now_rows)
        gone = _unique_rows(gone_rows)
        gone = gone[~np.isin(gone[:, 0], kept[:, 0])]  # a row in a file left on disk is there
        now = np.asarray(stored.get(key, empty), dtype=np.int64)
        every = np.concatenate([now, gone[:, 1]])
        seen = np.unique(every)
        a = np.unique(acked_seqs)
        in_now = np.isin(a, now)
        in_gone = np.isin(a, gone[:, 1]) & ~in_now
        v = np.unique(np.concatenate(versions)) if versions else empty
        v = v[v >= 0]  # -1: a segment known from the retention record only
        missing = a[~(in_now | in_gone)]
        unverified = _maybe_unseen(missing, _unique_rows(now_rows + gone_rows), ledger.unseen())
        out[key] = StepCount(
            acked=len(acked_seqs),
            stored=int(in_now.sum()),
            retention_deleted=int(in_gone.sum()),
            lost=len(acked_seqs) - int(in_now.sum() + in_gone.sum()) - unverified,
            unverified=unverified,
            stored_twice=len(every) - len(seen),
            unacked_rows=int((~np.isin(seen, a)).sum()),
            versions=len(v),
            last_version=int(v.max()) if len(v) else 0,
        )
    return out


def _maybe_unseen(missing: np.ndarray, rows: np.ndarray, gaps: list[tuple[int, int]]) -> int:
    """How many ``missing`` seqs an unseen row range could hold: one robot's seqs grow with
    its rows, so a seq lies between the rows of its neighbouring seqs that were read."""
    if not len(missing) or not gaps:
        return 0
    rows = rows[np.argsort(rows[:, 1])]
    at = np.searchsorted(rows[:, 1], missing)
    below = np.where(at > 0, rows[np.maximum(at - 1, 0), 0], -1)
    above = np.where(at < len(rows), rows[np.minimum(at, len(rows) - 1), 0], np.iinfo(np.int64).max)
    starts = np.array([g[0] for g in gaps], dtype=np.int64)
    ends = np.array([g[1] for g in gaps], dtype=np.int64)
    hit = (starts[None, :] < above[:, None]) & (ends[None, :] > below[:, None] + 1)
    return int(hit.any(axis=1).sum())


def _unique_rows(parts: list[np.ndarray]) -> np.ndarray:
    """(global row, seq) pairs, shape (n, 2), each global row once."""
    if not parts:
        return np.empty((0, 2), dtype=np.int64)
    pairs = np.concatenate(parts)
    _, first = np.unique(pairs[:, 0], return_index=True)
    return pairs[np.sort(first)]
