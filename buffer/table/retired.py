"""What retention deleted, durably: ``retired.jsonl`` in the buffer directory.

Retention (``buffer.table.retention``) appends one line per segment it deletes, fsynced before
the segment's files are unlinked, so a crash between the two leaves the record and the files
(the segment is then still on disk, and its line is ignored on open). A line::

    {"first_row": 0, "rows": 120, "robots": {"7": {"rows": 60, "seqs": [[0, 59]]}, ...}}

``seqs`` are inclusive ``[start, end]`` runs of the robot's seqs in that segment. On open the
lines are folded into per-robot runs (a few per robot however many steps it sent), so
``ReplayBuffer.contains`` / ``durable_seq`` / ``stored_seqs`` keep counting retired rows after a
reopen as they do in-process, and ``ReplayBuffer.retired_seqs`` tells them apart. A torn last
line (a crash mid-write) is skipped on read and cut off by the next writable open.

The file would grow by a line per deleted segment for the buffer's whole life, so once it
holds :data:`FOLD_LINES` lines retention folds it (:meth:`RetiredSeqs.fold`, after its
unlinks): it is rewritten atomically as one line per robot, its merged runs and retired row
count under the segment-less first row :data:`FOLDED_ROW`, read like any other line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Container, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from buffer.errors import CorruptDataError
from foundation.durable import append_line, atomic_write_text, fsync_dir

RETIRED_FILE = "retired.jsonl"
FOLD_LINES = 256  # a record this long is folded (at most twice the lines of the last fold)
FOLDED_ROW = -1  # first_row of a folded line: it names no segment, so never one on disk


def seq_runs(seqs: np.ndarray) -> list[list[int]]:
    """Inclusive ``[start, end]`` runs of the distinct values of int64 ``seqs`` (any order)."""
    s = np.unique(np.asarray(seqs, dtype=np.int64))
    if not len(s):
        return []
    breaks = np.flatnonzero(np.diff(s) != 1)
    starts = np.concatenate([s[:1], s[breaks + 1]])
    ends = np.concatenate([s[breaks], s[-1:]])
    return [[int(a), int(b)] for a, b in zip(starts, ends, strict=True)]


def segment_record(first_row: int, robots: np.ndarray, seqs: np.ndarray) -> dict[str, Any]:
    """The record of a segment at ``first_row`` whose rows have ``robots`` (str, shape (n,))
    and ``seqs`` (int64, shape (n,)); ``json.dumps`` of it is its line."""
    out: dict[str, Any] = {}
    for rid in sorted(set(robots.tolist())):
        mine = seqs[robots == rid]
        out[str(rid)] = {"rows": len(mine), "seqs": seq_runs(mine)}
    return {"first_row": int(first_row), "rows": len(seqs), "robots": out}


def read_lines(path: Path) -> list[dict[str, Any]]:
    """The complete lines of a record file (none when it is missing); a torn last line is
    skipped.

    Raises:
        CorruptDataError: a line other than the last is not a record line.
    """
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return []
    complete = text.split("\n")[:-1]  # text after the last newline is a torn line
    out = []
    for i, line in enumerate(complete):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            out.append(
                {
                    "first_row": int(d["first_row"]),
                    "rows": int(d["rows"]),
                    "robots": {
                        str(k): {
                            "rows": int(v["rows"]),
                            "seqs": [[int(a), int(b)] for a, b in v["seqs"]],
                        }
                        for k, v in d["robots"].items()
                    },
                }
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptDataError(
                f"{path}: line {i + 1} is not a retired-segment record: {exc}"
            ) from exc
    return out


def cut_torn_tail(path: Path) -> None:
    """Truncate ``path`` after its last newline (a line torn by a crash), durably, so the
    next append starts a line of its own."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    if not data or data.endswith(b"\n"):
        return
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, data.rfind(b"\n") + 1)
        os.fsync(fd)
    finally:
        os.close(fd)


class _Runs:
    """One robot's retired seqs as sorted, merged inclusive runs (and its retired rows)."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.rows = 0
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None

    def add(self, runs: Iterable[list[int]], rows: int) -> None:
        self.rows += rows
        self._arrays = None
        for a, b in runs:
            if self.ends and a > self.ends[-1]:
                if a == self.ends[-1] + 1:  # retention goes oldest first: mostly this
                    self.ends[-1] = b
                else:
                    self.starts.append(a)
                    self.ends.append(b)
                continue
            self.starts.append(a)
            self.ends.append(b)
            self._merge()

    def _merge(self) -> None:
        order = sorted(zip(self.starts, self.ends, strict=True))
        starts: list[int] = []
        ends: list[int] = []
        for a, b in order:
            if ends and a <= ends[-1] + 1:
                ends[-1] = max(ends[-1], b)
            else:
                starts.append(a)
                ends.append(b)
        self.starts, self.ends = starts, ends

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if self._arrays is None:
            self._arrays = (np.asarray(self.starts, np.int64), np.asarray(self.ends, np.int64))
        return self._arrays

    def contains(self, q: np.ndarray) -> np.ndarray:
        starts, ends = self.arrays()
        if not len(starts):
            return np.zeros(len(q), dtype=bool)
        at = np.searchsorted(starts, q, side="right") - 1
        return (at >= 0) & (q <= ends[np.maximum(at, 0)])

    def seqs(self) -> np.ndarray:
        starts, ends = self.arrays()
        if not len(starts):
            return np.empty(0, dtype=np.int64)
        return np.concatenate(
            [np.arange(a, b + 1, dtype=np.int64) for a, b in zip(starts, ends, strict=True)]
        )


class RetiredSeqs:
    """The record of ``directory`` in memory: per robot (its ``robot_id`` string) the seqs
    retention deleted, and how many of them the row index still holds (rows retired since
    open: the index keeps their seqs until compaction drops their rows,
    ``buffer.table.compaction``, which counts them out of ``in_index``).

    Not thread-safe on its own: call every method with the buffer's lock held.
    """

    def __init__(self, directory: Path, read_only: bool) -> None:
        self.path = directory / RETIRED_FILE
        self.read_only = read_only
        self.robots: dict[str, _Runs] = {}
        self.in_index: dict[str, int] = {}  # robot -> its oldest index seqs that are retired
        self.lines = 0  # complete lines in the file (counted on open, then kept)
        self._folded = 0  # lines the last fold wrote

    def load(self, on_disk: Container[int]) -> None:
        """Read the record, skipping segments whose first row is in ``on_disk`` (a crash
        came between the line and the unlink); a writable open cuts a torn last line.

        Raises:
            CorruptDataError: a line other than the last is not a record line.
        """
        if not self.read_only:
            cut_torn_tail(self.path)
        lines = read_lines(self.path)
        self.lines = len(lines)
        for line in lines:
            if line["first_row"] in on_disk:
                continue
            self._note(line["robots"])

    def _note(self, robots: dict[str, dict[str, Any]]) -> None:
        for rid, v in robots.items():
            self.robots.setdefault(rid, _Runs()).add(v["seqs"], v["rows"])

    def record(self, segments: list[tuple[int, np.ndarray, np.ndarray]]) -> None:
        """Append the lines of ``segments`` (first row, robot ids str (n,), seqs int64 (n,))
        and fsync them (and the directory when the file is created) before returning; then
        count them as retired. The segments' rows are in the row index.

        Raises:
            OSError: the lines could not be written (the file is as it was; nothing counted).
        """
        records = [segment_record(first, robots, seqs) for first, robots, seqs in segments]
        created = not self.path.exists()
        append_line(self.path, "\n".join(json.dumps(r, separators=(",", ":")) for r in records))
        if created:
            fsync_dir(self.path.parent)
        self.lines += len(records)
        for r in records:
            self._note(r["robots"])
            for rid, v in r["robots"].items():
                self.in_index[rid] = self.in_index.get(rid, 0) + int(v["rows"])

    def fold(self) -> bool:
        """Once the file holds :data:`FOLD_LINES` lines (and twice the last fold's, so many
        robots do not fold on every deletion), rewrite it as what is in memory: one
        :data:`FOLDED_ROW` line per robot. Call only after the recorded segments' files are
        unlinked: a line whose segment is still on disk (a crash before its unlink) is in
        memory only once that segment is recorded again, so it is dropped here as on open.
        Returns whether it folded.

        Raises:
            OSError: the file could not be rewritten (it is as it was; the next call retries).
        """
        if self.read_only or self.lines < max(FOLD_LINES, 2 * self._folded):
            return False
        lines = [
            json.dumps(
                {
                    "first_row": FOLDED_ROW,
                    "rows": runs.rows,
                    "robots": {
                        rid: {
                            "rows": runs.rows,
                            "seqs": [[a, b] for a, b in zip(runs.starts, runs.ends, strict=True)],
                        }
                    },
                },
                separators=(",", ":"),
            )
            for rid, runs in sorted(self.robots.items())
        ]
        atomic_write_text(self.path, "".join(x + "\n" for x in lines))
        self.lines = self._folded = len(lines)
        return True

    def contains(self, robot_id: str, q: np.ndarray) -> np.ndarray:
        """Which of int64 ``q`` (shape (n,)) are retired seqs of ``robot_id`` (bool (n,))."""
        runs = self.robots.get(robot_id)
        return runs.contains(q) if runs is not None else np.zeros(len(q), dtype=bool)

    def seqs(self, robot_id: str) -> np.ndarray:
        """The retired seqs of ``robot_id``, ascending, int64 (n,)."""
        runs = self.robots.get(robot_id)
        return runs.seqs() if runs is not None else np.empty(0, dtype=np.int64)

    def last(self, robot_id: str) -> int | None:
        """The highest retired seq of ``robot_id``, or None."""
        runs = self.robots.get(robot_id)
        return runs.ends[-1] if runs is not None and runs.ends else None
