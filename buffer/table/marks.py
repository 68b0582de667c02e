"""Episode marks: an operator's verdict on one robot's episode, or the episode's outcome.

A mark names an episode by ``(run_id, robot_id, episode_index)`` and its kind (:data:`KINDS`).
Two kinds exclude the episode (:data:`EXCLUDING`): ``discard``, and ``rerecord``, a discard
whose task the robot records again; the episode's rows, stored before or after the mark, are
never eligible (:meth:`buffer.table.index.RowIndex.discard`). Two kinds record how the episode ended
(:data:`OUTCOMES`: ``success``, ``failure``; the driver's success signal or an operator's
label) and exclude nothing: the index keeps which episodes succeeded, so a selection or a
mount can take only those (:meth:`buffer.table.index.RowIndex.set_outcome`); an episode's latest
outcome mark is the one that counts.

Marks are kept in ``episode_marks.jsonl`` in the buffer directory, one JSON line each
(``{"run_id", "robot_id", "episode_index", "kind", "reason", "time"}``; ``reason``: who
gave it, e.g. the operator's class name, ``classifier``, ``driver``, ``cloud: <actor>``; empty
when unknown), appended and fsynced before
:func:`record` returns (the file's first line also fsyncs the directory), and applied to the
row index. Opening a directory applies every stored mark again (:func:`apply_stored`); a line
torn by a crash (never acknowledged) is dropped.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from buffer.errors import DiskFullError, out_of_space
from buffer.table.index import EpisodeKey
from buffer.table.state import TableState
from foundation.durable import append_line, fsync_dir

MARKS_FILE = "episode_marks.jsonl"
EXCLUDING = ("discard", "rerecord")
OUTCOMES = ("success", "failure")
KINDS = (*EXCLUDING, *OUTCOMES)

_write_lock = threading.Lock()  # one writer at a time per process (lines stay whole)


def record(
    state: TableState, robot_id: str, run_id: str, episode_index: int, kind: str, reason: str = ""
) -> int:
    """Store the mark durably, then apply it; returns how many stored rows it applies to now:
    rows an excluding mark excludes (0 for an episode already excluded, or none of whose rows
    is stored yet), rows an outcome mark labels (0 when the outcome is already that).

    Raises:
        ValueError: an unknown ``kind``, an empty ``run_id`` / ``robot_id`` or a negative
            ``episode_index``.
        DiskFullError: the disk has no space for the mark; nothing changed (retry).
        OSError: the mark could not be written otherwise; nothing changed.
    """
    return record_many(state, [(robot_id, run_id, episode_index, kind)], reason)


def record_many(
    state: TableState, marks: Sequence[tuple[str, str, int, str]], reason: str = ""
) -> int:
    """:func:`record` of several ``(robot_id, run_id, episode_index, kind)`` marks with one
    fsync (an import's outcomes), all given by ``reason``; returns the rows they apply to now,
    summed. All are checked before any is written."""
    keys = [(_check(*m), m[3]) for m in marks]
    with state.lock:
        new = [(key, kind) for key, kind in keys if _changes(state, key, kind, reason)]
    if not new:
        return 0
    path = state.directory / MARKS_FILE
    now = time.time()
    lines = "\n".join(
        json.dumps(
            {
                "run_id": k[0],
                "robot_id": k[1],
                "episode_index": k[2],
                "kind": kind,
                "reason": reason,
                "time": now,
            }
        )
        for k, kind in new
    )
    with _write_lock:
        first = not path.exists()
        try:
            append_line(path, lines)
        except OSError as exc:
            if out_of_space(exc):
                raise DiskFullError(
                    state.directory, exc, "the episode mark was not stored"
                ) from exc
            raise
        if first:
            fsync_dir(state.directory)
    with state.lock:
        return sum(_apply(state, key, kind, reason) for key, kind in new)


def _check(robot_id: str, run_id: str, episode_index: int, kind: str) -> EpisodeKey:
    if kind not in KINDS:
        raise ValueError(f"unknown episode mark {kind!r}; choose one of {', '.join(KINDS)}")
    if not run_id or not robot_id:
        raise ValueError("an episode mark names its run_id and robot_id")
    if episode_index < 0:
        raise ValueError(f"episode_index must be >= 0, got {episode_index}")
    return (run_id, robot_id, int(episode_index))


def _changes(state: TableState, key: EpisodeKey, kind: str, reason: str) -> bool:
    """Whether the mark would change the index (a repeated mark is not stored again)."""
    if kind in OUTCOMES:
        index = state.index
        return index.outcomes.get(key) != kind or index.outcome_by.get(key, "") != reason
    return key not in state.index.discards


def _apply(state: TableState, key: EpisodeKey, kind: str, reason: str = "") -> int:
    if kind in OUTCOMES:
        return state.index.set_outcome(key, kind, reason)
    return state.index.discard(key, kind)


def apply_stored(state: TableState) -> None:
    """Apply every mark of the directory to the (just rebuilt) row index; a torn last line
    is dropped, and cut off the file when the buffer is writable."""
    path = state.directory / MARKS_FILE
    if not path.exists():
        return
    data = path.read_bytes()
    whole = data[: data.rfind(b"\n") + 1]
    if len(whole) < len(data) and not state.read_only:
        _truncate(path, len(whole))
    for raw in whole.splitlines():
        m = json.loads(raw)
        key = (str(m["run_id"]), str(m["robot_id"]), int(m["episode_index"]))
        _apply(state, key, str(m["kind"]), str(m.get("reason", "")))


def _truncate(path: Path, size: int) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)
