"""Episode marks: an operator's verdict that one robot's episode must never be trained on.

A mark names an episode by ``(run_id, robot_id, episode_index)`` and its kind (:data:`KINDS`:
``discard``, or ``rerecord``, a discard whose task the robot records again). Marks are kept
in ``episode_marks.jsonl`` in the buffer directory, one JSON line each
(``{"run_id", "robot_id", "episode_index", "kind", "time"}``), appended and fsynced before
:func:`record` returns (the file's first line also fsyncs the directory), and applied to the
row index (:meth:`buffer.index.RowIndex.discard`): the episode's rows, stored before or after
the mark, are never eligible. Opening a directory applies every stored mark again
(:func:`apply_stored`); a line torn by a crash (never acknowledged) is dropped.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from buffer.state import TableState
from robofleet.durable import append_line, fsync_dir

MARKS_FILE = "episode_marks.jsonl"
KINDS = ("discard", "rerecord")

_write_lock = threading.Lock()  # one writer at a time per process (lines stay whole)


def record(state: TableState, robot_id: str, run_id: str, episode_index: int, kind: str) -> int:
    """Store the mark durably, then apply it; returns how many stored rows it excludes now
    (0 for an episode already marked, or none of whose rows is stored yet).

    Raises:
        ValueError: an unknown ``kind``, an empty ``run_id`` / ``robot_id`` or a negative
            ``episode_index``.
        OSError: the mark could not be written; nothing changed.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown episode mark {kind!r}; choose one of {', '.join(KINDS)}")
    if not run_id or not robot_id:
        raise ValueError("an episode mark names its run_id and robot_id")
    if episode_index < 0:
        raise ValueError(f"episode_index must be >= 0, got {episode_index}")
    key = (run_id, robot_id, int(episode_index))
    with state.lock:
        if key in state.index.discards:
            return 0
    path = state.directory / MARKS_FILE
    line = {"run_id": run_id, "robot_id": robot_id, "episode_index": key[2], "kind": kind}
    with _write_lock:
        new = not path.exists()
        append_line(path, json.dumps({**line, "time": time.time()}))
        if new:
            fsync_dir(state.directory)
    with state.lock:
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
        state.index.discard(key, str(m["kind"]))


def _truncate(path: Path, size: int) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)
