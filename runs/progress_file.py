"""``progress.jsonl``: a run's figures, one JSON row per record (every two seconds), bounded.

A row per record is ~350 KB an hour for as long as the run lasts, so once the file passes
:data:`PROGRESS_ROWS` rows it is thinned the way the metadata store thins a metric series
(``foundation.store.retention.thinned``): the first row and the newest half stay whole, every
other row of the rest goes, again until it fits (3/4 of the cap to the cap remain). Rows stay
in order, so its readers (the run report's curves, the last row's figures) read it as before.
The rewrite is atomic (a reader sees the old file or the new one) and rare: the rows are
counted once, at the first append, and kept counted after.
"""

from __future__ import annotations

import errno
import json
import logging
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

from foundation.durable import append_line, atomic_write_bytes
from foundation.store.retention import thinned

log = logging.getLogger(__name__)

PROGRESS_FILE = "progress.jsonl"
PROGRESS_ROWS = 4096  # rows past which the file is thinned (the newest ~1.1 hours stay whole)


def disk_full(exc: OSError) -> bool:
    """Whether ``exc`` says the file system is out of space (or quota)."""
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)


def count_lines(path: Path) -> int:
    """Newline-ended lines of ``path`` (0 when it is missing), read in 1 MiB blocks."""
    try:
        with path.open("rb") as f:
            return sum(block.count(b"\n") for block in iter(partial(f.read, 1 << 20), b""))
    except FileNotFoundError:
        return 0


def thin_lines(path: Path, cap: int) -> int:
    """Rewrite ``path`` atomically and durably with at most ``cap`` of its lines, in order:
    the first, the newest ``cap // 2``, and an even share of those between (``thinned``). A
    torn tail (text after the last newline) is kept as it was. Returns the lines kept.

    Raises:
        OSError: the file could not be read or rewritten (it is as it was).
    """
    *lines, tail = path.read_bytes().split(b"\n")
    doomed = set(thinned(range(len(lines)), cap))
    kept = [x for i, x in enumerate(lines) if i not in doomed]
    atomic_write_bytes(path, b"".join(x + b"\n" for x in kept) + tail)
    return len(kept)


class ProgressFile:
    """One run's ``progress.jsonl``, thinned once it passes ``cap`` rows.

    Args:
        path: the file (created by the first append).
        cap: :data:`PROGRESS_ROWS`; a test passes a smaller one.

    Not thread-safe: one writer (the run's ``RunProgress``).
    """

    def __init__(self, path: Path, cap: int = PROGRESS_ROWS) -> None:
        self.path = path
        self.cap = cap
        self.rows: int | None = None  # counted at the first append, then kept

    def append(self, row: Mapping[str, Any]) -> None:
        """Append ``row`` as one JSON line (whole or not at all, fsynced), then thin the file
        if it passed the cap. A full disk that stops the thinning only delays it (to the next
        append): the row is written.

        Raises:
            OSError: the row could not be written (the file is as it was).
        """
        if self.rows is None:
            self.rows = count_lines(self.path)
        append_line(self.path, json.dumps(row))
        self.rows += 1
        if self.rows <= self.cap:
            return
        try:
            self.rows = thin_lines(self.path, self.cap)
        except OSError as exc:
            if not disk_full(exc):
                raise
            log.warning("%s: disk full; thinning waits for space", self.path)
