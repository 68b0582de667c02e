"""Did the buffer keep everything it acknowledged? Counted from both ends, after the run.

Each robot's spool (``edge_agent.spool``) records the highest ``seq`` the cloud acknowledged
(``state.json``: ``acked_seq``) and every range it dropped itself while offline and full
(``dropped.jsonl``). Every other seq in ``[0, acked_seq]`` was acknowledged, so it must be in
the run's buffer; :func:`acked_lost` counts those that are not.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent.credential import read_credential


def stored_mask(buffer: Any, robot_key: str, seqs: np.ndarray) -> np.ndarray:
    """Which of ``seqs`` of robot ``robot_key`` the buffer holds durably (bool array)."""
    result: np.ndarray = buffer.contains(robot_key, seqs)
    return result


def robot_ledger(spool: Path) -> tuple[str, int, set[int]] | None:
    """(robot key in the buffer, acked seq, dropped seqs) of one robot's spool, or None."""
    state = spool / "state.json"
    cred = read_credential(spool) if state.exists() else None
    if cred is None:
        return None
    acked = int(json.loads(state.read_text()).get("acked_seq", -1))
    robot_key = str(cred.robot_id)
    dropped: set[int] = set()
    log = spool / "dropped.jsonl"
    if log.exists():
        for line in log.read_text().splitlines():
            if line.strip():
                d = json.loads(line)
                dropped.update(range(int(d["first_seq"]), int(d["last_seq"]) + 1))
    return robot_key, acked, dropped


def acked_lost(buffer: Any, robots_dir: Path) -> int:
    """Acknowledged steps (over every robot spool under ``robots_dir``) missing from ``buffer``."""
    lost = 0
    if not robots_dir.exists():
        return 0
    for spool in sorted(p for p in robots_dir.iterdir() if p.is_dir()):
        ledger = robot_ledger(spool)
        if ledger is None:
            continue
        key, acked, dropped = ledger
        if acked < 0:
            continue
        seqs = np.array([s for s in range(acked + 1) if s not in dropped], dtype=np.int64)
        lost += int(np.count_nonzero(~stored_mask(buffer, key, seqs)))
    return lost


def acked_total(robots_dir: Path) -> int:
    """How many steps the robots' spools say the cloud acknowledged (all robots)."""
    total = 0
    if robots_dir.exists():
        for spool in robots_dir.iterdir():
            ledger = robot_ledger(spool) if spool.is_dir() else None
            if ledger is not None:
                total += max(0, ledger[1] + 1 - len(ledger[2]))
    return total
