"""The run's accounting of acknowledged steps (issue 16, finding 1): counted from the buffer's
contents against what each robot's spool says the cloud acknowledged, per robot."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from buffer import BufferSettings, ReplayBuffer
from edge_agent.credential import RobotCredential, write_credential
from foundation.runspec import RunSpec
from runs.accounting import (
    RobotAccount,
    acked_lost,
    acked_total,
    reported_accounts,
    robot_accounts,
)
from runs.report import write_report
from tests.comms.helpers import BUFFER_SCHEMA, buffer_steps


@pytest.fixture
def buffer(tmp_path: Path) -> Iterator[ReplayBuffer]:
    buf = ReplayBuffer.open(tmp_path / "buffer", BUFFER_SCHEMA)
    yield buf
    buf.close()


def _spool(
    robots: Path,
    name: str,
    robot_id: int,
    acked_seq: int,
    drops: tuple[dict[str, object], ...] = (),
) -> None:
    """A robot's spool directory as the edge agent leaves it: credential, state, drop log."""
    d = robots / name
    write_credential(d, RobotCredential(robot_id, f"secret-{name}"))
    state = {"next_seq": acked_seq + 1, "acked_seq": acked_seq}
    (d / "state.json").write_text(json.dumps(state))
    if drops:
        (d / "dropped.jsonl").write_text("".join(json.dumps(x) + "\n" for x in drops))


def _drop(first: int, last: int, released: bool) -> dict[str, object]:
    reason = "spool full: dropped newest" if released else "spool full: dropped oldest"
    return {
        "first_seq": first,
        "last_seq": last,
        "steps": last - first + 1,
        "reason": reason,
        "seq_released": released,
        "time": 0.0,
    }


def test_two_spools_acknowledged_for_one_robot_count_what_one_buffer_row_cannot_back(
    tmp_path: Path, buffer: ReplayBuffer
) -> None:
    """Two agents with one robot's credential were both told seq 0..9 is stored; the buffer
    holds one row per seq, so ten acknowledged steps are not there (before: 0 lost)."""
    robots = tmp_path / "robots"
    buffer.append(buffer_steps(7, 0, 10))
    _spool(robots, "arm-1", 7, 9)
    _spool(robots, "arm-1-copy", 7, 9)
    assert acked_total(robots.iterdir()) == 20
    assert acked_lost(buffer, robots.iterdir()) == 10
    assert robot_accounts(buffer, robots.iterdir()) == {
        "7": RobotAccount(
            spools=["arm-1", "arm-1-copy"], acked=20, lost=10, buffered=10, dropped_on_robot=0
        )
    }


def test_seqs_a_spool_gave_back_and_reused_are_checked(
    tmp_path: Path, buffer: ReplayBuffer
) -> None:
    """``drop_newest`` gives the dropped batch's seqs back and the next batch reuses them: those
    seqs were acknowledged for other steps and must be in the buffer (before: skipped)."""
    robots = tmp_path / "robots"
    buffer.append(buffer_steps(3, 0, 5))
    buffer.append(buffer_steps(3, 10, 5))
    # seq 5..9 dropped on the robot and given back, then reused and acknowledged (0..14);
    # seq 20..24 dropped oldest later (never sent, above the ack: not counted either way).
    _spool(robots, "arm-3", 3, 14, (_drop(5, 9, released=True), _drop(20, 24, released=False)))
    assert acked_total(robots.iterdir()) == 15
    assert acked_lost(buffer, robots.iterdir()) == 5
    (account,) = robot_accounts(buffer, robots.iterdir()).values()
    assert (account.acked, account.lost, account.buffered, account.dropped_on_robot) == (
        15,
        5,
        10,
        10,
    )


def test_seqs_a_spool_dropped_unsent_are_not_counted_lost(
    tmp_path: Path, buffer: ReplayBuffer
) -> None:
    robots = tmp_path / "robots"
    buffer.append(buffer_steps(4, 0, 5))
    buffer.append(buffer_steps(4, 10, 5))
    _spool(robots, "arm-4", 4, 14, (_drop(5, 9, released=False),))
    assert acked_total(robots.iterdir()) == 10
    assert acked_lost(buffer, robots.iterdir()) == 0


def test_the_report_carries_each_robots_counts(tmp_path: Path, buffer: ReplayBuffer) -> None:
    robots = tmp_path / "robots"
    buffer.append(buffer_steps(1, 0, 8))
    buffer.append(buffer_steps(2, 0, 4))
    _spool(robots, "arm-1", 1, 9)  # seq 8, 9 acknowledged and not stored
    _spool(robots, "arm-2", 2, 3)
    spec = RunSpec.model_validate(
        {"algorithm": "hg-dagger", "tasks": ["reach-v3"], "robots": {"robot_type": "sim_arm"}}
    )
    summary = write_report(
        tmp_path,
        "run-1",
        spec,
        learner_restarts=0,
        accounts=robot_accounts(buffer, robots.iterdir()),
        elapsed_s=60.0,
    )
    assert summary["acked_lost"] == 2
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["acked_lost"] == 2
    assert report["robots"] == {
        "1": {
            "spools": ["arm-1"],
            "acked": 10,
            "lost": 2,
            "buffered": 8,
            "dropped_on_robot": 0,
            "retention_deleted": 0,
        },
        "2": {
            "spools": ["arm-2"],
            "acked": 4,
            "lost": 0,
            "buffered": 4,
            "dropped_on_robot": 0,
            "retention_deleted": 0,
        },
    }
    assert report["acked_retention_deleted"] == 0


def test_a_robot_computers_final_report_is_counted_like_its_spool(
    tmp_path: Path, buffer: ReplayBuffer
) -> None:
    """Spools live on the robot computers: the run counts from the final report each sends
    when released (``acked_seq``, ``seq_gaps``: drops whose seqs were not given back)."""
    buffer.append(buffer_steps(4, 0, 5))
    buffer.append(buffer_steps(4, 10, 5))
    buffer.append(buffer_steps(5, 0, 8))
    reports = {
        "4": {"acked_seq": 14.0, "seq_gaps": 5.0, "dropped_steps": 5.0},  # 5..9 never sent
        "5": {"acked_seq": 9.0, "seq_gaps": 0.0, "dropped_steps": 0.0},  # 8, 9 acked, not stored
    }
    accounts = reported_accounts(buffer, reports)
    assert accounts["4"] == RobotAccount(
        spools=["final report"], acked=10, lost=0, buffered=10, dropped_on_robot=5
    )
    assert (accounts["5"].acked, accounts["5"].lost) == (10, 2)


def test_acked_steps_retention_deleted_before_a_reopen_are_not_lost(tmp_path: Path) -> None:
    """Retention deletes old segments, then the cloud restarts (the buffer is reopened): the
    acknowledged steps in those segments were stored, not lost (before: counted lost)."""
    small = BufferSettings(segment_target_bytes=2000, retention_max_bytes=8000)
    with ReplayBuffer.open(tmp_path / "buffer", BUFFER_SCHEMA, small) as buf:
        for first in range(0, 400, 20):
            buf.append(buffer_steps(1, first, 20))
            buf.append(buffer_steps(2, first, 20))
    robots = tmp_path / "robots"
    _spool(robots, "arm-1", 1, 409)  # 400..409 acknowledged and not stored
    _spool(robots, "arm-2", 2, 399)
    reports = {"1": {"acked_seq": 409.0}, "2": {"acked_seq": 399.0}}
    with ReplayBuffer.open(tmp_path / "buffer") as again:
        deleted = len(again.retired_seqs("1"))
        assert deleted > 0 and again.first_row > 0
        assert acked_lost(again, robots.iterdir()) == 10
        for accounts in (
            robot_accounts(again, robots.iterdir()),
            reported_accounts(again, reports),
        ):
            one, two = accounts["1"], accounts["2"]
            assert (one.acked, one.lost, one.retention_deleted) == (410, 10, deleted)
            assert one.buffered == 400 - deleted
            assert (two.acked, two.lost) == (400, 0) and two.retention_deleted > 0
