"""What ``robofleet bench soak`` samples, and its verdict on each sampled series.

Processes are read from ``/proc`` (Linux): resident memory, open file descriptors, threads and
sockets (descriptors that are sockets). Files: a directory's bytes, a SQLite database's bytes
(with its ``-wal`` and ``-shm`` files) and its rows per table.

A series is judged over the second half of the run (the first half holds start-up):
``flat`` when its spread stays within the tolerance, ``bounded`` when it moves but the peak of
its last third is no higher than the peak of its first third (plus the tolerance), else
``growing`` at its least-squares slope.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REL_TOL = 0.05  # share of a series' median within which it counts as unchanged
MIB = 1024**2


@dataclass(frozen=True)
class ProcSample:
    """One process now: ``rss_bytes``, open ``fds``, ``threads``, ``sockets`` (fds that are)."""

    rss_bytes: int
    fds: int
    threads: int
    sockets: int

    def __add__(self, other: ProcSample) -> ProcSample:
        return ProcSample(
            self.rss_bytes + other.rss_bytes,
            self.fds + other.fds,
            self.threads + other.threads,
            self.sockets + other.sockets,
        )


def proc_sample(pid: int) -> ProcSample | None:
    """Process ``pid``'s resources from ``/proc``; None when it is gone or a zombie."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields.get("State", "").strip().startswith("Z"):
            return None
        rss_kib = int(fields.get("VmRSS", "0 kB").split()[0])
        threads = int(fields["Threads"])
        fd_dir = f"/proc/{pid}/fd"
        sockets = fds = 0
        for fd in os.listdir(fd_dir):
            fds += 1
            try:
                if os.readlink(f"{fd_dir}/{fd}").startswith("socket:"):
                    sockets += 1
            except OSError:  # closed meanwhile
                pass
    except (OSError, KeyError, ValueError):
        return None
    return ProcSample(rss_kib * 1024, fds, threads, sockets)


def sum_samples(pids: Iterable[int]) -> ProcSample | None:
    """The resources of ``pids`` added up; None when none of them is there."""
    found = [s for s in (proc_sample(p) for p in pids) if s is not None]
    if not found:
        return None
    total = found[0]
    for s in found[1:]:
        total = total + s
    return total


def children_map() -> dict[int, list[int]]:
    """Parent pid -> its child pids, for every process now (``/proc/*/stat``)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    return children


def descendants(root: int, children: dict[int, list[int]] | None = None) -> list[int]:
    """Pids of every process below ``root`` (children, theirs, ...)."""
    tree = children_map() if children is None else children
    out, todo = [], [root]
    while todo:
        for c in tree.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def cmdline(pid: int) -> list[str]:
    """Process ``pid``'s argv (empty when it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def dir_bytes(path: Path) -> int:
    """Bytes of the regular files under ``path`` (files that vanish meanwhile are skipped)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def sqlite_figures(db: Path) -> tuple[int, dict[str, int]]:
    """(bytes of the database with its ``-wal``/``-shm`` files, rows per table), read-only."""
    size = sum(p.stat().st_size for p in (db, Path(f"{db}-wal"), Path(f"{db}-shm")) if p.exists())
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5.0)
    try:
        tables = [
            r[0]
            for r in con.execute(
                "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'"
            )
        ]
        rows = {t: int(con.execute(f'SELECT COUNT(*) FROM "{t}"').fetchone()[0]) for t in tables}
    finally:
        con.close()
    return size, rows


# -- verdicts -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """A series over the second half of the run.

    Attributes:
        kind: ``flat``, ``bounded``, ``growing`` or ``too few samples``.
        slope_per_h: least-squares slope, units per hour.
        first / last / peak: its first, last and highest value in that half.
        samples: how many points the half held.
    """

    kind: str
    slope_per_h: float
    first: float
    last: float
    peak: float
    samples: int

    def text(self, unit: str) -> str:
        if self.kind == "growing":
            return f"growing {self.slope_per_h:+.3g} {unit}/h"
        return self.kind


def second_half(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points (time s, value) from the middle of their time span on."""
    if not points:
        return []
    t0, t1 = points[0][0], points[-1][0]
    mid = t0 + (t1 - t0) / 2
    return [p for p in points if p[0] >= mid]


def judge(points: Sequence[tuple[float, float]], abs_tol: float) -> Verdict:
    """The verdict (module docstring) on a series of (time s, value) points, time-ordered.

    ``abs_tol``: the least change that counts (e.g. 2 descriptors, 8 MiB), besides
    :data:`REL_TOL` of the series' median.
    """
    half = second_half(points)
    if len(half) < 3:
        v = [p[1] for p in half]
        return Verdict("too few samples", 0.0, v[0] if v else 0.0, v[-1] if v else 0.0,
                       max(v, default=0.0), len(v))  # fmt: skip
    t = np.array([p[0] for p in half], dtype=np.float64)
    y = np.array([p[1] for p in half], dtype=np.float64)
    slope = float(np.polyfit(t - t[0], y, 1)[0]) * 3600.0 if t[-1] > t[0] else 0.0
    tol = max(abs_tol, REL_TOL * abs(float(np.median(y))))
    base = Verdict("flat", slope, float(y[0]), float(y[-1]), float(y.max()), len(y))
    if float(y.max() - y.min()) <= tol:
        return base
    third = (t[-1] - t[0]) / 3
    early = y[t <= t[0] + third]
    late = y[t >= t[-1] - third]
    if float(late.max()) <= float(early.max()) + tol:
        return Verdict("bounded", slope, base.first, base.last, base.peak, base.samples)
    return Verdict("growing", slope, base.first, base.last, base.peak, base.samples)
