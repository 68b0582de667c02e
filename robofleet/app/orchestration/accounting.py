"""Did the buffer keep everything it acknowledged? Counted from both ends, after the run.

Each robot's spool (``edge_agent.spool``) records the highest ``seq`` the cloud acknowledged
(``state.json``: ``acked_seq``) and every range it dropped itself while offline and full
(``dropped.jsonl``). Every other seq in ``[0, acked_seq]`` was acknowledged, so it must be in
the run's buffer. :func:`reported_lost` counts those that are not from what each robot
computer reported when it was released (``acked_seq`` and ``dropped_steps`` of its final
report: the spools live on the robots); :func:`acked_lost` does the same from spool
directories one can read (tests, a robot computer's own check).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent.credential import read_credential


def stored_mask(buffer: Any, robot_key: str, seqs: np.ndarray) -> np.ndarray:
    """Which of ``seqs`` of robot ``robot_key`` the buffer holds durably (bool array)."""
    result: np.ndarray = buffer.contains(robot_key, seqs)
    return result


def robot_ledger(spool: Path) -> tuple[str, int, set[int]] | None:
    """(robot key in the buffer, acked seq, dropped seqs) of one robot's spool, or None. A run's
    spool on a robot computer (``<root>/runs/<run>``) has its credential in ``<root>``."""
    state = spool / "state.json"
    cred = None
    if state.exists():
        cred = read_credential(spool)
        if cred is None and spool.parent.name == "runs":
            cred = read_credential(spool.parent.parent)
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


def reported_lost(buffer: Any, reports: Mapping[int, Mapping[str, float]]) -> int:
    """Acknowledged steps missing from ``buffer``, from each robot's final report (robot id ->
    ``EdgeAgent.report()``: ``acked_seq``, ``dropped_steps``)."""
    lost = 0
    for robot_id, report in sorted(reports.items()):
        acked = int(report.get("acked_seq", -1))
        if acked < 0:
            continue
        seqs = np.arange(acked + 1, dtype=np.int64)
        stored = int(np.count_nonzero(stored_mask(buffer, str(robot_id), seqs)))
        lost += max(0, acked + 1 - int(report.get("dropped_steps", 0)) - stored)
    return lost


def acked_lost(buffer: Any, spools: Iterable[Path]) -> int:
    """Acknowledged steps (over the robot spool directories ``spools``) missing from ``buffer``."""
    lost = 0
    for spool in sorted(spools):
        ledger = robot_ledger(spool)
        if ledger is None:
            continue
        key, acked, dropped = ledger
        if acked < 0:
            continue
        seqs = np.array([s for s in range(acked + 1) if s not in dropped], dtype=np.int64)
        lost += int(np.count_nonzero(~stored_mask(buffer, key, seqs)))
    return lost


def acked_total(spools: Iterable[Path]) -> int:
    """How many steps the robot spools ``spools`` say the cloud acknowledged (all robots)."""
    total = 0
    for spool in spools:
        ledger = robot_ledger(spool) if spool.is_dir() else None
        if ledger is not None:
            total += max(0, ledger[1] + 1 - len(ledger[2]))
    return total
