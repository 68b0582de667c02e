"""Did the buffer keep everything it acknowledged? Counted from both ends, after the run.

Each robot's spool (``edge_agent.spool``) records the highest ``seq`` the cloud acknowledged
(``state.json``: ``acked_seq``) and every range it dropped itself while full
(``dropped.jsonl``). Every seq in ``[0, acked_seq]`` was acknowledged to that spool except the
dropped ones, so each must be backed by a row of that robot in the run's buffer; a dropped
range whose seqs the spool gave back (``seq_released``: ``drop_newest``) was reused by the next
steps, so those seqs count as acknowledged like any other.

The counts are per robot (its id, the ``robot_id`` column), over every spool holding that
robot's credential: one buffer row backs one acknowledgement, so when two spools (two agents
with one credential) were both told a seq is stored, one of them lost its step.

Spools live on the robot computers, so a run's report counts from what each computer sent
when it was released (:func:`reported_accounts`: its final report's ``acked_seq`` and
``seq_gaps``, the steps its spool dropped without giving their seqs back);
:func:`robot_accounts` counts from spool directories one can read (a robot computer's own
check, tests).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent.credential import read_credential


@dataclass(frozen=True)
class RobotAccount:
    """One robot's steps at the end of a run.

    Attributes:
        spools: names (under the run's ``robots`` directory) of the spools with its credential.
        acked: steps its spools say the cloud acknowledged (a seq acknowledged to two spools
            counts twice).
        lost: acknowledged steps with no buffer row to back them, stored or deleted by
            retention (its record, ``ReplayBuffer.retired_seqs``, survives reopens).
        buffered: rows of this robot still in the buffer (acknowledged or not).
        dropped_on_robot: steps its spools dropped themselves while full (never acknowledged;
            not the cloud's loss).
        retention_deleted: acknowledged steps (each seq once) that were stored and then
            deleted by retention: not lost.
    """

    spools: list[str]
    acked: int
    lost: int
    buffered: int
    dropped_on_robot: int
    retention_deleted: int = 0


@dataclass(frozen=True)
class _Ledger:
    """What one spool says: its robot, the seqs acknowledged to it, the steps it dropped."""

    name: str
    robot_key: str
    acked: np.ndarray  # int64, ascending
    dropped_steps: int


def _ledger(spool: Path) -> _Ledger | None:
    """The ledger of one robot's spool directory, or None when it holds no robot yet. A run's
    spool on a robot computer (``<root>/runs/<run>``) has its credential in ``<root>``."""
    state = spool / "state.json"
    if not state.exists():
        return None
    cred = read_credential(spool)
    name = spool.name
    if cred is None and spool.parent.name == "runs":
        cred, name = read_credential(spool.parent.parent), spool.parent.parent.name
    if cred is None:
        return None
    acked_seq = int(json.loads(state.read_text()).get("acked_seq", -1))
    unsent: list[np.ndarray] = []  # seqs that never carried a sent step
    dropped_steps = 0
    log = spool / "dropped.jsonl"
    for line in log.read_text().splitlines() if log.exists() else []:
        if not line.strip():
            continue
        d = json.loads(line)
        first, last = int(d["first_seq"]), int(d["last_seq"])
        dropped_steps += last - first + 1
        if not d.get("seq_released", False):
            unsent.append(np.arange(first, last + 1, dtype=np.int64))
    acked: np.ndarray = np.arange(acked_seq + 1, dtype=np.int64)
    if unsent:
        acked = acked[~np.isin(acked, np.concatenate(unsent))]
    return _Ledger(name, str(cred.robot_id), acked, dropped_steps)


def _ledgers(spools: Iterable[Path]) -> list[_Ledger]:
    found = (_ledger(p) for p in sorted(spools) if p.is_dir())
    return [x for x in found if x is not None]


def _retention_deleted(buffer: Any, key: str, seqs: np.ndarray) -> int:
    """How many of the distinct ``seqs`` of robot ``key`` retention deleted from ``buffer``."""
    return int(np.count_nonzero(np.isin(np.unique(seqs), buffer.retired_seqs(key))))


def robot_accounts(buffer: Any, spools: Iterable[Path]) -> dict[str, RobotAccount]:
    """Per robot (its id as the buffer's ``robot_id`` string), over the spool directories
    ``spools`` of the run: what was acknowledged, what of it the buffer cannot back, what it
    holds.

    Args:
        buffer: the run's ``buffer.ReplayBuffer`` (``contains``, ``stored_seqs``,
            ``retired_seqs``).
        spools: the run's spool directories (one or more per robot).
    """
    by_robot: dict[str, list[_Ledger]] = {}
    for ledger in _ledgers(spools):
        by_robot.setdefault(ledger.robot_key, []).append(ledger)
    out: dict[str, RobotAccount] = {}
    for key, ledgers in sorted(by_robot.items()):
        seqs, times = np.unique(np.concatenate([x.acked for x in ledgers]), return_counts=True)
        stored = np.asarray(buffer.contains(key, seqs), dtype=bool)
        acked = int(times.sum())
        out[key] = RobotAccount(
            spools=[x.name for x in ledgers],
            acked=acked,
            lost=acked - int(np.count_nonzero(stored)),
            buffered=len(buffer.stored_seqs(key, retired=False)),
            dropped_on_robot=sum(x.dropped_steps for x in ledgers),
            retention_deleted=_retention_deleted(buffer, key, seqs),
        )
    return out


def reported_accounts(
    buffer: Any, reports: Mapping[str, Mapping[str, float]]
) -> dict[str, RobotAccount]:
    """Per robot (its id as the buffer's ``robot_id`` string), from each robot computer's
    final report of the run (``EdgeAgent.report()``: ``acked_seq``, ``seq_gaps``,
    ``dropped_steps``): every seq up to ``acked_seq`` but the gaps was acknowledged once."""
    out: dict[str, RobotAccount] = {}
    for key, report in sorted(reports.items()):
        acked_seq = int(report.get("acked_seq", -1))
        gaps = int(report.get("seq_gaps", 0))
        seqs = np.arange(acked_seq + 1, dtype=np.int64)
        stored = int(np.count_nonzero(np.asarray(buffer.contains(key, seqs), dtype=bool)))
        acked = max(0, acked_seq + 1 - gaps)
        out[key] = RobotAccount(
            spools=["final report"],
            acked=acked,
            lost=max(0, acked - stored),
            buffered=len(buffer.stored_seqs(key, retired=False)),
            dropped_on_robot=int(report.get("dropped_steps", 0)),
            retention_deleted=_retention_deleted(buffer, key, seqs),
        )
    return out


def acked_lost(buffer: Any, spools: Iterable[Path]) -> int:
    """Acknowledged steps (over the robot spool directories ``spools``) missing from ``buffer``."""
    return sum(a.lost for a in robot_accounts(buffer, spools).values())


def acked_total(spools: Iterable[Path]) -> int:
    """How many steps the robot spools ``spools`` say the cloud acknowledged (all robots)."""
    return sum(len(x.acked) for x in _ledgers(spools))


def acked_seqs(spools: Iterable[Path]) -> dict[str, np.ndarray]:
    """Robot id (the buffer's ``robot_id`` string) -> the seqs its spools among ``spools`` say
    the cloud acknowledged: int64, ascending, a seq acknowledged to two spools twice."""
    by_robot: dict[str, list[np.ndarray]] = {}
    for ledger in _ledgers(spools):
        by_robot.setdefault(ledger.robot_key, []).append(ledger.acked)
    return {k: np.sort(np.concatenate(v)) for k, v in sorted(by_robot.items())}
