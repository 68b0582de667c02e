"""``robofleet bench soak``'s arithmetic: the verdict on a sampled series (flat, bounded,
growing with its slope), the fault schedule's scaling with ``--minutes``, and the step count
that keeps rows deleted by retention apart from rows lost."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from robofleet.bench.soak import FAULTS, end_grace_s, fault_schedule
from robofleet.bench.soak_ledger import SegmentLedger, SegmentRows, count_steps
from robofleet.bench.soak_probe import judge, proc_sample, second_half
from robofleet.bench.soak_report import tolerance


def _series(values: list[float], every_s: float = 3.0) -> list[tuple[float, float]]:
    return [(i * every_s, v) for i, v in enumerate(values)]


def test_a_steady_series_is_flat_and_noise_within_tolerance_too() -> None:
    assert judge(_series([100.0] * 40), abs_tol=4).kind == "flat"
    noisy = 100.0 + np.random.default_rng(0).uniform(-2, 2, 40)
    assert judge(_series(list(noisy)), abs_tol=4).kind == "flat"


def test_a_sawtooth_is_bounded_and_a_ramp_is_growing_at_its_slope() -> None:
    saw = [float(10 + (i % 10) * 5) for i in range(60)]  # retention's rise and drop
    assert judge(_series(saw), abs_tol=1).kind == "bounded"
    ramp = judge(_series([float(i) for i in range(60)], every_s=1.0), abs_tol=1)
    assert ramp.kind == "growing"
    assert ramp.slope_per_h == pytest.approx(3600.0, rel=1e-6)  # 1 a second
    assert (ramp.first, ramp.last, ramp.peak) == (30.0, 59.0, 59.0)  # the second half only


def test_start_up_in_the_first_half_does_not_count() -> None:
    warm = [float(i * 10) for i in range(20)] + [200.0] * 20  # climbs, then holds
    assert second_half(_series(warm))[0][0] == 60.0  # 0 .. 117 s: from 58.5 s on
    assert judge(_series(warm), abs_tol=2).kind == "flat"
    assert judge(_series([1.0, 2.0]), abs_tol=1).kind == "too few samples"


def test_tolerances_follow_the_series_unit() -> None:
    assert tolerance("cloud rss MiB") == 16.0 and tolerance("edge soak-01 fds") == 4.0
    assert tolerance("data dir MiB") == 1.0 and tolerance("metadata rows events") == 1.0


def test_this_process_is_sampled_from_proc() -> None:
    import os

    got = proc_sample(os.getpid())
    assert got is not None and got.rss_bytes > 0 and got.threads >= 1 and got.fds >= 3
    assert proc_sample(2**22 + 12345) is None  # no such process


def test_three_minutes_inject_every_fault_once_and_ten_three_times() -> None:
    once = fault_schedule(3)
    assert sorted(k for _, k in once) == sorted(FAULTS)
    assert all(0 <= at < 180 for at, _ in once)
    assert [at for at, _ in once] == sorted(at for at, _ in once)
    ten = fault_schedule(10)
    assert all(sum(1 for _, k in ten if k == f) == 3 for f in FAULTS)
    assert max(at for at, _ in ten) < 600
    with pytest.raises(ValueError, match="--minutes"):
        fault_schedule(0)


def test_the_wait_for_the_runs_to_end_grows_with_the_cloud_kills_they_sat_out() -> None:
    # Each cycle kills the cloud once; a run's clock stops while its cloud is down.
    assert end_grace_s(3) == 420.0
    assert end_grace_s(10) == 420.0 + 2 * 45.0
    assert end_grace_s(60) == 420.0 + 19 * 45.0


def _rows(robot: str, seqs: list[int]) -> SegmentRows:
    n = len(seqs)
    return SegmentRows(np.array([robot] * n), np.array(seqs, np.int64), np.zeros(n, np.int64))


def test_rows_deleted_by_retention_are_counted_apart_from_lost_and_twice() -> None:
    ledger = SegmentLedger(Path("/nonexistent"))
    ledger.rows[(0, 4)] = _rows("7", [0, 1, 2, 3])  # deleted by retention at the end
    ledger.rows[(4, 4)] = _rows("7", [4, 5, 5, 6])  # seq 5 stored twice
    ledger.rows[(8, 2)] = _rows("9", [0, 1])
    acked = {"7": np.arange(9, dtype=np.int64), "9": np.arange(2, dtype=np.int64)}
    stored = {"7": np.array([4, 5, 5, 6]), "9": np.array([0, 1])}  # the buffer left
    got = count_steps(ledger, {(4, 4), (8, 2)}, acked, stored)
    seven = got["7"]
    assert (seven.acked, seven.stored, seven.retention_deleted) == (9, 3, 4)
    assert (seven.lost, seven.stored_twice, seven.unacked_rows) == (2, 1, 0)  # seqs 7, 8
    assert (got["9"].lost, got["9"].stored) == (0, 2)
    assert seven.unverified == 0 and ledger.rows_unseen() == 0


def test_missing_steps_where_unread_rows_could_hold_them_are_unverified_not_lost() -> None:
    ledger = SegmentLedger(Path("/nonexistent"))
    ledger.rows[(0, 3)] = _rows("9", [0, 1, 2])
    ledger.rows[(10, 2)] = _rows("9", [8, 9])  # rows 3..9 were sealed and deleted unread
    ledger.rows[(12, 2)] = _rows("9", [11, 12])  # seq 10 is missing with nothing unread near
    acked = {"9": np.arange(13, dtype=np.int64)}
    got = count_steps(
        ledger, {(0, 3), (10, 2), (12, 2)}, acked, {"9": np.array([0, 1, 2, 8, 9, 11, 12])}
    )
    assert ledger.unseen() == [(3, 10)] and ledger.rows_unseen() == 7
    assert (got["9"].unverified, got["9"].lost) == (5, 1)  # seqs 3..7 could be there; 10 not


def _retained_unread(tmp_path: Path, scan_at: int | None = None) -> tuple[Any, ...]:
    """Two robots' 380 acknowledged steps each through a buffer with small segments and
    retention, the ledger scanning at ``scan_at`` (a seq) and once at the end: the ledger,
    the acked and stored seqs per robot, and ``count_steps``' figures."""
    from buffer import BufferSettings, ReplayBuffer
    from robofleet.bench.soak_report import final_seqs
    from tests.comms.helpers import BUFFER_SCHEMA, buffer_steps

    small = BufferSettings(segment_target_bytes=2000, retention_max_bytes=8000)
    ledger = SegmentLedger(tmp_path / "buffer")
    with ReplayBuffer.open(tmp_path / "buffer", BUFFER_SCHEMA, small) as buf:
        for first in range(20, 400, 20):
            buf.append(buffer_steps(2, first - 20, 20))
            buf.append(buffer_steps(1, first - 20, 20))
            if first == scan_at:
                ledger.scan()
    ledger.scan()
    acked = {"1": np.arange(380, dtype=np.int64), "2": np.arange(380, dtype=np.int64)}
    stored = final_seqs(tmp_path, acked)
    return ledger, acked, stored, count_steps(ledger, ledger.on_disk(), acked, stored)


def test_segments_retention_deleted_unread_are_known_from_the_buffers_record(tmp_path) -> None:
    """The ledger reads the buffer's record of deleted segments: a segment sealed and deleted
    between two scans is counted as deleted by retention, not unseen (before: unverified)."""
    # some segments read before retention deletes them, most deleted unread
    ledger, acked, stored, got = _retained_unread(tmp_path, scan_at=100)
    assert ledger.rows_unseen() == 0 and ledger.unreadable == 0
    for key, seqs in acked.items():
        c = got[key]
        assert (c.lost, c.unverified, c.stored_twice, c.unacked_rows) == (0, 0, 0, 0)
        assert c.stored == len(stored[key]) and c.stored + c.retention_deleted == len(seqs)
        assert c.retention_deleted > 0
        # policy versions come from segments read; the record does not carry them
        assert (c.versions, c.last_version) in {(1, 3), (0, 0)}
    assert any(c.versions == 1 for c in got.values())


def test_segments_folded_out_of_the_record_unread_are_unverified_not_lost(
    tmp_path, monkeypatch
) -> None:
    """Once retention folds its record (a line per robot, naming no rows), segments sealed,
    deleted and folded between two scans are unseen rows: their steps are unverified, never
    lost nor stored twice."""
    from buffer.table import retired

    monkeypatch.setattr(retired, "FOLD_LINES", 2)
    ledger, acked, stored, got = _retained_unread(tmp_path)
    assert ledger.rows_unseen() > 0
    for key, seqs in acked.items():
        c = got[key]
        assert (c.lost, c.stored_twice, c.unacked_rows) == (0, 0, 0)
        assert c.unverified > 0 and c.stored + c.retention_deleted + c.unverified == len(seqs)
