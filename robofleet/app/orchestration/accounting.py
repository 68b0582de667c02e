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
"""

from __future__ import annotations

import json
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
        lost: acknowledged steps with no buffer row to back them.
        buffered: rows of this robot in the buffer (acknowledged or not).
        dropped_on_robot: steps its spools dropped themselves while full (never acknowledged;
            not the cloud's loss).
    """

    spools: list[str]
    acked: int
    lost: int
    buffered: int
    dropped_on_robot: int


@dataclass(frozen=True)
class _Ledger:
    """What one spool says: its robot, the seqs acknowledged to it, the steps it dropped."""

    name: str
    robot_key: str
    acked: np.ndarray  # int64, ascending
    dropped_steps: int


def _ledger(spool: Path) -> _Ledger | None:
    """The ledger of one robot's spool directory, or None when it holds no robot yet."""
    state = spool / "state.json"
    cred = read_credential(spool) if state.exists() else None
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
    return _Ledger(spool.name, str(cred.robot_id), acked, dropped_steps)


def _ledgers(robots_dir: Path) -> list[_Ledger]:
    if not robots_dir.exists():
        return []
    found = (_ledger(p) for p in sorted(robots_dir.iterdir()) if p.is_dir())
    return [x for x in found if x is not None]


def robot_accounts(buffer: Any, robots_dir: Path) -> dict[str, RobotAccount]:
    """Per robot (its id as the buffer's ``robot_id`` string), over every spool under
    ``robots_dir``: what was acknowledged, what of it the buffer cannot back, what it holds.

    Args:
        buffer: the run's ``buffer.ReplayBuffer`` (``contains``, ``stored_seqs``).
        robots_dir: the run's ``robots`` directory (one spool directory per robot).
    """
    by_robot: dict[str, list[_Ledger]] = {}
    for ledger in _ledgers(robots_dir):
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
            buffered=len(buffer.stored_seqs(key)),
            dropped_on_robot=sum(x.dropped_steps for x in ledgers),
        )
    return out


def acked_lost(buffer: Any, robots_dir: Path) -> int:
    """Acknowledged steps (over every robot spool under ``robots_dir``) missing from ``buffer``."""
    return sum(a.lost for a in robot_accounts(buffer, robots_dir).values())


def acked_total(robots_dir: Path) -> int:
    """How many steps the robots' spools say the cloud acknowledged (all robots)."""
    return sum(len(x.acked) for x in _ledgers(robots_dir))
