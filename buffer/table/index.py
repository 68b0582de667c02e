"""The row index: small per-row columns kept in RAM, derived entirely from stored rows.

It holds what samplers and filters need without touching payload (observations, actions):
scalar columns, dictionary codes for robot/run/task, episode links (``next_row``/``prev_row``
to a step's true successor/predecessor in the same episode) and per-robot ``seq`` lists for
de-duplication. Nothing here is persisted: :meth:`RowIndex.add` over the segments and the WAL
rebuilds it on open, and the buffer's episode marks (``buffer.table.marks``) are applied again.

Two rules change flags the stored rows do not carry:

* **Discarded episodes** (an operator's rerecord or discard, :meth:`RowIndex.discard`): every
  row of the episode, stored before or after the mark, is ``discarded`` and never
  ``eligible``, so no sampler, selection or count sees it.
* **Episode outcomes** (:meth:`RowIndex.set_outcome`): which episodes succeeded or failed,
  kept per episode (no per-row column); :meth:`RowIndex.select` with ``success_only`` takes the
  rows of successful episodes, stored before or after the outcome was marked.
* **Interrupted episodes**: a robot's rows arrive in seq order, so when a robot's row of
  another episode is indexed while its previous episode has no done step, that episode was
  interrupted (its agent was killed, or crashed) and no more of it will come. It is closed as
  truncated at its last transition: the step before its last stored one, whose successor (the
  last stored step) supplies its next observation. The last stored step, whose outcome was
  never observed, stays no transition.

Row ids are global: row ``r`` is the r-th step ever stored in the directory. Arrays are indexed
by ``r - base`` where ``base`` is the first row the index holds: the first row on disk when it
was built, advanced by compaction (``buffer.table.compaction``) once retention has deleted
enough rows below it. ``base`` and ``cols`` change together: a reader outside the buffer's lock
takes them as one pair with :meth:`RowIndex.frame`.

Memory: the index is the one part of the buffer that grows with the rows outside the memory
budget: 77 bytes per row in ``cols`` plus 8 in the robots' seq lists (85 B/row), for the rows
still stored plus the retired ones compaction has not dropped yet. Its arrays
live in their own anonymous mappings (``buffer.table.memory``), so the doubling as it grows gives
the old array back to the OS at once and the new half is resident only once written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from buffer.columns import StepColumns, Strings
from buffer.table.memory import anon_array
from buffer.table.retired import RetiredSeqs
from foundation.rows import RowFilter

_COLUMNS: dict[str, Any] = {
    "seq": np.int64,
    "robot": np.int32,
    "run": np.int32,
    "task": np.int32,
    "episode_index": np.int64,
    "frame_index": np.int64,
    "timestamp": np.float64,
    "reward": np.float32,
    "terminated": np.bool_,
    "truncated": np.bool_,
    "is_intervention": np.bool_,
    "policy_version": np.int64,
    "next_row": np.int64,
    "prev_row": np.int64,
    "eligible": np.bool_,
    "discarded": np.bool_,
}

# (run_id, robot_id, episode_index) of an episode, by name.
EpisodeKey = tuple[str, str, int]

# (base, cols): the index's columns and the global row of their position 0, taken together.
Frame = tuple[int, dict[str, np.ndarray]]


class _Vocab:
    """String <-> dense int code."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.codes: dict[str, int] = {}

    def encode(self, values: np.ndarray) -> np.ndarray:
        out = np.empty(len(values), dtype=np.int32)
        for i, v in enumerate(values):
            code = self.codes.get(v)
            if code is None:
                code = self.codes[v] = len(self.names)
                self.names.append(v)
            out[i] = code
        return out

    def encode_strings(self, s: Strings) -> np.ndarray:
        """Codes of a dictionary-encoded column's rows, int32 ``(n,)``."""
        if s.single:
            return np.full(len(s.codes), self.encode(np.asarray(s.names, dtype=object))[0])
        return self.encode(np.asarray(s.names, dtype=object))[s.codes]


@dataclass
class _RobotSeqs:
    seqs: np.ndarray = field(default_factory=lambda: np.empty(64, dtype=np.int64))
    n: int = 0

    @property
    def last(self) -> int:
        return int(self.seqs[self.n - 1]) if self.n else -(2**63)

    def extend(self, values: np.ndarray) -> None:
        need = self.n + len(values)
        if need > len(self.seqs):
            grown = anon_array((max(need, 2 * len(self.seqs)),), np.dtype(np.int64))
            grown[: self.n] = self.seqs[: self.n]
            self.seqs = grown
        self.seqs[self.n : need] = values
        self.n = need

    def contains(self, values: np.ndarray) -> np.ndarray:
        s = self.seqs[: self.n]
        pos = np.searchsorted(s, values)
        pos = np.minimum(pos, max(self.n - 1, 0))
        return (s[pos] == values) if self.n else np.zeros(len(values), dtype=bool)


class RowIndex:
    """Per-row columns for rows ``[base, end)``; see the module docstring."""

    def __init__(self, base: int = 0, capacity: int = 4096) -> None:
        cols = {k: anon_array((capacity,), np.dtype(t)) for k, t in _COLUMNS.items()}
        # One attribute, so a reader without the lock never pairs a new base with old arrays.
        self._frame: Frame = (base, cols)
        self.end = base
        self.robots = _Vocab()
        self.runs = _Vocab()
        self.tasks = _Vocab()
        self.robot_seqs: dict[int, _RobotSeqs] = {}
        # (run, robot, episode) -> (row, frame_index) of the latest step of an open episode.
        self._open: dict[tuple[int, int, int], tuple[int, int]] = {}
        self._robot_open: dict[int, tuple[int, int, int]] = {}  # robot -> its open episode
        self.robot_last_row: dict[int, int] = {}
        self.discards: dict[EpisodeKey, str] = {}  # discarded episode -> the mark's kind
        self.outcomes: dict[EpisodeKey, str] = {}  # episode -> "success" / "failure"
        self.outcome_by: dict[EpisodeKey, str] = {}  # episode -> who gave its outcome
        self.discarded_steps = 0
        self.interrupted_episodes = 0

    @property
    def base(self) -> int:
        """Global row of position 0 of every column."""
        return self._frame[0]

    @property
    def cols(self) -> dict[str, np.ndarray]:
        """The columns (see ``_COLUMNS`` for dtypes), shape ``(capacity,)``, valid for
        positions ``[0, end - base)``; a growing index replaces arrays in this dict."""
        return self._frame[1]

    def frame(self) -> Frame:
        """``(base, cols)`` as one consistent pair (compaction replaces both at once; the
        arrays it replaces are left as they were, so a reader holding them stays right)."""
        return self._frame

    def rebase(self, base: int, cols: dict[str, np.ndarray]) -> None:
        """Make ``cols`` (the rows from ``base`` on, up to ``end``) the columns; for
        compaction (``buffer.table.compaction``), with the lock held.

        Raises:
            ValueError: ``base`` is outside ``[self.base, end]``.
        """
        if not self.base <= base <= self.end:
            raise ValueError(f"cannot rebase rows [{self.base}, {self.end}) at {base}")
        self._frame = (base, cols)

    def forget_open_before(self, row: int) -> None:
        """Forget the episodes left open whose latest row is below ``row`` (dropped by
        compaction): as after a reopen, which never saw those rows, a later step of one
        starts unlinked and another episode of its robot does not close it."""
        for key, (last, _) in list(self._open.items()):
            if last < row:
                del self._open[key]
                if self._robot_open.get(key[1]) == key:
                    del self._robot_open[key[1]]
        for code, last in list(self.robot_last_row.items()):
            if last < row:
                del self.robot_last_row[code]

    def __len__(self) -> int:
        return self.end - self.base

    def view(self, name: str) -> np.ndarray:
        """Column ``name`` for rows ``[base, end)`` (index with ``row - base``)."""
        return self.cols[name][: self.end - self.base]

    # -- de-duplication -----------------------------------------------------------------
    def classify_seqs(
        self, robots: Strings, seqs: np.ndarray, retired: RetiredSeqs | None = None
    ) -> tuple[np.ndarray, int]:
        """Split a validated batch (its ``robot_id`` column dictionary-encoded, and ``seq``):
        ``(is_duplicate mask, first out-of-order row or -1)``.

        A seq at or below its robot's highest stored seq is a duplicate when that exact seq
        is stored, otherwise it is out of order. ``retired``: seqs retention deleted count as
        stored (compaction drops them from the index; the record keeps them).
        """
        dup = np.zeros(len(seqs), dtype=bool)
        for local, rid in enumerate(robots.names):
            code = self.robots.codes.get(rid)
            rs = self.robot_seqs.get(code) if code is not None else None
            gone = retired.last(rid) if retired is not None else None
            if rs is None and gone is None:
                continue
            top = max(rs.last if rs is not None else -(2**63), -(2**63) if gone is None else gone)
            rows: np.ndarray = (
                np.arange(len(seqs)) if robots.single else np.flatnonzero(robots.codes == local)
            )
            s = seqs[rows]
            old = s <= top
            if not old.any():
                continue
            q = s[old]
            known = rs.contains(q) if rs is not None else np.zeros(len(q), dtype=bool)
            if gone is not None and retired is not None and not known.all():
                known |= retired.contains(rid, q)
            if not known.all():
                return dup, int(rows[np.flatnonzero(old)[np.flatnonzero(~known)[0]]])
            dup[rows[old]] = True
        return dup, -1

    def last_seq(self, robot_id: str) -> int | None:
        code = self.robots.codes.get(robot_id)
        if code is None or code not in self.robot_seqs or self.robot_seqs[code].n == 0:
            return None
        return self.robot_seqs[code].last

    # -- insertion ----------------------------------------------------------------------
    def _reserve(self, n: int) -> None:
        need = self.end - self.base + n
        cap = len(self.cols["seq"])
        if need <= cap:
            return
        new_cap = max(need, 2 * cap)
        for k, arr in self.cols.items():
            # Its own mapping: the old array goes back to the OS when replaced (no heap
            # fragmentation), and the new half is not resident until rows are written.
            grown = anon_array((new_cap,), arr.dtype)
            grown[:cap] = arr
            self.cols[k] = grown

    def add(self, batch: pa.RecordBatch | StepColumns) -> tuple[int, int]:
        """Index a validated, de-duplicated batch (or its small columns, ``buffer.columns``)
        as rows ``[end, end + n)``.

        Links each step to its predecessor (same run, robot and episode, frame_index one less,
        predecessor not done). Returns the row range. Rows are not marked ``eligible`` here;
        :meth:`publish` does that once they are durable and visible.
        """
        sc = batch if isinstance(batch, StepColumns) else StepColumns.of(batch)
        n = sc.n
        self._reserve(n)
        lo = self.end - self.base
        hi = lo + n
        c = self.cols
        for name, values in sc.num.items():  # the numeric columns, as they are
            c[name][lo:hi] = values
        robot = self.robots.encode_strings(sc.robot)
        run = self.runs.encode_strings(sc.run)
        c["robot"][lo:hi] = robot
        c["run"][lo:hi] = run
        c["task"][lo:hi] = self.tasks.encode_strings(sc.task)
        c["next_row"][lo:hi] = -1
        c["prev_row"][lo:hi] = -1
        c["eligible"][lo:hi] = False
        c["discarded"][lo:hi] = False
        first = self.end
        ep, fr = sc.num["episode_index"], sc.num["frame_index"]
        self._link(lo, first, run, robot, ep, fr, sc.done)
        self._note_seqs(first, robot, sc.seq, sc.robot.single)
        self.end += n
        if self.discards:
            self._discard_new(lo, run, robot, ep)
        return first, self.end

    def _link(
        self,
        lo: int,
        first: int,
        run: np.ndarray,
        robot: np.ndarray,
        ep: np.ndarray,
        fr: np.ndarray,
        done: np.ndarray,
    ) -> None:
        """Link the new rows ``first ..`` (index position ``lo ..``) to their predecessors."""
        c = self.cols
        n = len(run)
        rows = np.arange(first, first + n, dtype=np.int64)
        # Inside a run of rows with the same (run, robot, episode), link consecutive frames
        # vectorized; only each run's first row looks up the episode left open before it.
        same = np.zeros(n, dtype=bool)
        same[1:] = (run[1:] == run[:-1]) & (robot[1:] == robot[:-1]) & (ep[1:] == ep[:-1])
        inner = same.copy()
        inner[1:] &= (fr[1:] == fr[:-1] + 1) & ~done[:-1]
        linked = np.flatnonzero(inner)
        c["next_row"][linked - 1 + lo] = rows[linked]
        c["prev_row"][linked + lo] = rows[linked - 1]
        starts = np.flatnonzero(~same)
        ends = np.append(starts[1:], n) - 1
        for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
            key = (int(run[s]), int(robot[s]), int(ep[s]))
            before = self._robot_open.get(key[1])
            if before is not None and before != key:
                self._close_interrupted(before)
            prev = self._open.get(key)
            if prev is not None and prev[1] == fr[s] - 1:
                c["next_row"][prev[0] - self.base] = rows[s]
                c["prev_row"][lo + s] = prev[0]
            if done[e]:
                self._open.pop(key, None)
                self._robot_open.pop(key[1], None)
            else:
                self._open[key] = (int(rows[e]), int(fr[e]))
                self._robot_open[key[1]] = key

    def _close_interrupted(self, key: tuple[int, int, int]) -> None:
        """Close the robot's episode ``key`` (codes) that another of its episodes followed
        with no done step: truncated at its last transition (see the module docstring)."""
        self._robot_open.pop(key[1], None)
        last = self._open.pop(key, None)
        if last is None:
            return
        prev = int(self.cols["prev_row"][last[0] - self.base])
        if prev >= self.base:
            self.cols["truncated"][prev - self.base] = True
            self.interrupted_episodes += 1

    def _note_seqs(self, first: int, robot: np.ndarray, seqs: np.ndarray, single: bool) -> None:
        """Extend each robot's seq list with the new rows ``first ..`` (``robot`` codes;
        ``single``: all rows are one robot's)."""
        if single:
            code = int(robot[0])
            self.robot_seqs.setdefault(code, _RobotSeqs()).extend(seqs)
            self.robot_last_row[code] = first + len(seqs) - 1
            return
        for code in np.unique(robot).tolist():
            rs = self.robot_seqs.setdefault(int(code), _RobotSeqs())
            mine = robot == code
            rs.extend(seqs[mine])
            self.robot_last_row[int(code)] = first + int(np.flatnonzero(mine)[-1])

    def truncate(self, end: int) -> None:
        """Forget rows ``[end, self.end)`` (never published: a failed write's rows and those
        behind it), as if they had never been added: links into them, their seqs, the
        robots' last rows and the episodes they left open are what they were before.
        Names they added to the vocabularies stay (codes are never reused).

        Raises:
            ValueError: ``end`` is outside ``[base, self.end]``.
        """
        if not self.base <= end <= self.end:
            raise ValueError(f"cannot truncate rows [{self.base}, {self.end}) to end {end}")
        lo, hi = end - self.base, self.end - self.base
        if lo == hi:
            return
        c = self.cols
        nxt = c["next_row"][:lo]
        nxt[nxt >= end] = -1
        dropped = {int(k) for k in np.unique(c["robot"][lo:hi])}
        keys = set(
            zip(*(c[k][lo:hi].tolist() for k in ("run", "robot", "episode_index")), strict=True)
        )
        self.end = end
        for code in dropped:
            mine = np.flatnonzero(c["robot"][:lo] == code)
            rs = self.robot_seqs[code]
            rs.n = len(mine)  # a robot's seqs are in row order: its first len(mine)
            if len(mine):
                self.robot_last_row[code] = int(mine[-1]) + self.base
            else:
                self.robot_last_row.pop(code, None)
        for key in keys:
            # The episode's latest row before ``end``, open unless it was done.
            run, robot, ep = key
            same = (c["run"][:lo] == run) & (c["robot"][:lo] == robot)
            rows = np.flatnonzero(same & (c["episode_index"][:lo] == ep))
            last = int(rows[-1]) if len(rows) else -1
            if last < 0 or c["terminated"][last] or c["truncated"][last]:
                self._open.pop(key, None)
            else:
                self._open[key] = (last + self.base, int(c["frame_index"][last]))

    def publish(self, first: int, end: int) -> int:
        """Mark rows ``[first, end)`` visible: done steps and newly linked predecessors
        become eligible transitions, unless discarded. Returns how many became eligible."""
        lo, hi = first - self.base, end - self.base
        c = self.cols
        done = (c["terminated"][lo:hi] | c["truncated"][lo:hi]) & ~c["discarded"][lo:hi]
        # An interrupted episode's done step needs its successor visible (its next observation).
        done &= c["next_row"][lo:hi] < end
        prev = c["prev_row"][lo:hi]
        linked = prev[prev >= self.base] - self.base
        linked = linked[~c["discarded"][linked]]
        c["eligible"][lo:hi] |= done
        c["eligible"][linked] = True
        return int(done.sum()) + len(linked)

    # -- discarded episodes ---------------------------------------------------------------
    def discard(self, key: EpisodeKey, kind: str) -> int:
        """Discard episode ``key`` (``(run_id, robot_id, episode_index)``): its rows stored so
        far and any indexed later are never eligible. Returns how many stored rows it holds
        now (0 for a key discarded already: nothing changes)."""
        if key in self.discards:
            return 0
        self.discards[key] = kind
        run, robot = self.runs.codes.get(key[0]), self.robots.codes.get(key[1])
        if run is None or robot is None:
            return 0
        c = {k: self.view(k) for k in ("run", "robot", "episode_index")}
        rows = np.flatnonzero(
            (c["robot"] == robot) & (c["run"] == run) & (c["episode_index"] == key[2])
        )
        self.cols["discarded"][rows] = True
        self.cols["eligible"][rows] = False
        self.discarded_steps += len(rows)
        return len(rows)

    def _discard_new(self, lo: int, run: np.ndarray, robot: np.ndarray, ep: np.ndarray) -> None:
        """Flag the rows just added at index position ``lo ..`` of discarded episodes."""
        keys = np.stack([run, robot, ep.astype(np.int64)], axis=1)
        for r, b, e in np.unique(keys, axis=0).tolist():
            name = (self.runs.names[r], self.robots.names[b], int(e))
            if name in self.discards:
                mine = np.flatnonzero((run == r) & (robot == b) & (ep == e)) + lo
                self.cols["discarded"][mine] = True
                self.discarded_steps += len(mine)

    # -- episode outcomes -----------------------------------------------------------------
    def set_outcome(self, key: EpisodeKey, outcome: str, reason: str = "") -> int:
        """Record episode ``key``'s outcome (``success`` or ``failure``; the latest counts)
        and who gave it (``reason``, ``buffer.table.marks``). Returns how many of its rows
        are stored now."""
        self.outcomes[key] = outcome
        self.outcome_by[key] = reason
        run, robot = self.runs.codes.get(key[0]), self.robots.codes.get(key[1])
        if run is None or robot is None:
            return 0
        c = {k: self.view(k) for k in ("run", "robot", "episode_index")}
        mine = (c["robot"] == robot) & (c["run"] == run) & (c["episode_index"] == key[2])
        return int(np.count_nonzero(mine))

    def success_mask(self, a: int, b: int, cols: dict[str, np.ndarray] | None = None) -> np.ndarray:
        """Bool mask of index positions ``[a, b)``: the row's episode was marked a success.
        ``cols``: the columns those positions are of (a :meth:`frame`'s; default ``cols``)."""
        by_pair: dict[tuple[int, int], list[int]] = {}
        # One snapshot (list() copies the items without running Python code, so no other
        # thread runs in between): a mark adds outcomes under the lock while this runs
        # without it (:meth:`select`).
        for (run_id, robot_id, ep), outcome in list(self.outcomes.items()):
            run, robot = self.runs.codes.get(run_id), self.robots.codes.get(robot_id)
            if outcome == "success" and run is not None and robot is not None:
                by_pair.setdefault((run, robot), []).append(ep)
        c = self.cols if cols is None else cols
        mask = np.zeros(b - a, dtype=bool)
        for (run, robot), eps in by_pair.items():
            mine = (c["run"][a:b] == run) & (c["robot"][a:b] == robot)
            mask |= mine & np.isin(c["episode_index"][a:b], eps)
        return mask

    def successful_episodes(self) -> int:
        """Episodes marked a success (by their latest outcome mark)."""
        return sum(1 for o in list(self.outcomes.values()) if o == "success")

    # -- queries ------------------------------------------------------------------------
    def select(self, lo: int, hi: int, rows: RowFilter) -> np.ndarray:
        """Eligible rows in ``[lo, hi)`` that ``rows`` keeps (global row ids, ascending).
        Safe without the lock (one :meth:`frame`)."""
        base, cols = self.frame()
        a, b = max(lo, base) - base, min(hi, self.end) - base
        if b <= a:
            return np.empty(0, dtype=np.int64)
        keep = cols["eligible"][a:b] & self.matches(a, b, rows, cols)
        return np.flatnonzero(keep).astype(np.int64) + a + base

    def matches(
        self, a: int, b: int, rows: RowFilter, cols: dict[str, np.ndarray] | None = None
    ) -> np.ndarray:
        """Bool mask of the local rows ``[a, b)`` that ``rows`` keeps, eligible or not.
        ``cols``: the columns those positions are of (a :meth:`frame`'s; default ``cols``).

        ``success_only``: rows of episodes marked a success (:meth:`set_outcome`).
        ``time_range``: rows whose ``timestamp`` (seconds since their episode's start) is in
        ``[t0, t1]``.
        """
        c = self.cols if cols is None else cols
        keep = np.ones(b - a, dtype=bool)
        for vocab, col, wanted in (
            (self.tasks, "task", rows.tasks),
            (self.robots, "robot", rows.robot_ids),
            (self.runs, "run", rows.run_ids),
        ):
            if wanted is not None:
                codes = [vocab.codes[w] for w in wanted if w in vocab.codes]
                keep &= np.isin(c[col][a:b], codes)
        policy_versions = rows.policy_versions
        if policy_versions is not None:
            pv = c["policy_version"][a:b]
            if isinstance(policy_versions, tuple):
                keep &= (pv >= policy_versions[0]) & (pv <= policy_versions[1])
            else:
                keep &= np.isin(pv, list(policy_versions))
        if rows.interventions_only:
            keep &= c["is_intervention"][a:b]
        if rows.success_only:
            keep &= self.success_mask(a, b, c)
        if rows.time_range is not None:
            t0, t1 = float(rows.time_range[0]), float(rows.time_range[1])
            ts = c["timestamp"][a:b]
            keep &= (ts >= t0) & (ts <= t1)
        return keep

    def summary(self, segments: list[tuple[int, int, str]]) -> dict[str, Any]:
        """Episodes, tasks, robots, policy versions, intervention counts, segment offsets."""
        n = len(self)
        c = {k: self.view(k) for k in ("robot", "run", "task", "episode_index")}
        episodes = set()
        if n:
            keys = np.stack([c["run"], c["robot"], c["episode_index"]], axis=1)
            episodes = {tuple(k) for k in np.unique(keys, axis=0).tolist()}
        tasks = {
            name: int(np.count_nonzero(c["task"] == code))
            for code, name in enumerate(self.tasks.names)
        }
        pv, pv_counts = np.unique(self.view("policy_version"), return_counts=True)
        kinds = list(self.discards.values())
        return {
            "rows": n,
            "transitions": int(np.count_nonzero(self.view("eligible"))),
            "episodes": len(episodes),
            "discarded_episodes": {k: kinds.count(k) for k in sorted(set(kinds))},
            "discarded_steps": self.discarded_steps,
            "interrupted_episodes": self.interrupted_episodes,
            "robots": {
                name: int(self.robot_seqs[code].n) if code in self.robot_seqs else 0
                for code, name in enumerate(self.robots.names)
            },
            "runs": list(self.runs.names),
            "tasks": tasks,
            "policy_versions": {int(v): int(k) for v, k in zip(pv, pv_counts, strict=True)},
            "interventions": int(np.count_nonzero(self.view("is_intervention"))),
            "successful_episodes": self.successful_episodes(),
            "failed_episodes": sum(1 for o in self.outcomes.values() if o == "failure"),
            "segments": [{"first_row": f, "num_rows": k, "path": p} for f, k, p in segments],
        }
