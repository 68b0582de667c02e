"""Public per-robot lookups: durable_seq, stored_seqs, contains."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from buffer import ReplayBuffer
from tests.buffer.helpers import episodes, open_buffer


def test_lookups_follow_appends_and_survive_a_reopen(tmp_path) -> None:
    with open_buffer(tmp_path / "b") as buf:
        assert buf.durable_seq("robot-0") is None
        assert buf.stored_seqs("robot-0").dtype == np.int64 and len(buf.stored_seqs("robot-0")) == 0
        assert not buf.contains("robot-0", [0, 1]).any()
        buf.append(episodes(0, [5]))
        buf.append(episodes(0, [3], seq0=10, ep0=1))  # a gap 5..9: dropped on the robot
        buf.append(episodes(7, [4], seq0=100))
        assert buf.durable_seq("robot-0") == 12 and buf.durable_seq("robot-7") == 103
        np.testing.assert_array_equal(buf.stored_seqs("robot-0"), [0, 1, 2, 3, 4, 10, 11, 12])
        mask = buf.contains("robot-0", np.array([4, 5, 9, 10, 12, 13, -1]))
        assert mask.tolist() == [True, False, False, True, True, False, False]
        assert buf.contains("robot-7", []).shape == (0,)
        assert buf.durable_seq("robot-9") is None
        with pytest.raises(ValueError, match="1-D integer"):
            buf.contains("robot-0", [[1, 2]])
        with pytest.raises(ValueError, match="1-D integer"):
            buf.contains("robot-0", [1.5])
        buf.stored_seqs("robot-0")[:] = -5  # a copy: the buffer's index is untouched
        assert buf.durable_seq("robot-0") == 12
    with ReplayBuffer.open(tmp_path / "b", read_only=True) as again:
        assert again.durable_seq("robot-0") == 12
        np.testing.assert_array_equal(again.stored_seqs("robot-7"), [100, 101, 102, 103])


def test_rows_waiting_for_their_fdatasync_are_not_reported(tmp_path) -> None:
    buf = open_buffer(tmp_path / "b", wal_stripes=1)
    buf.append(episodes(0, [4]))
    log = buf.writer.wal.logs[0]  # noqa: SLF001 - hold this append's fdatasync
    real_sync, entered, release = log.sync, threading.Event(), threading.Event()

    def held_sync(lsn: int) -> None:
        entered.set()
        release.wait(30)
        real_sync(lsn)

    log.sync = held_sync  # type: ignore[method-assign]
    t = threading.Thread(target=buf.append, args=(episodes(0, [3], seq0=4, ep0=1),))
    t.start()
    try:
        assert entered.wait(30)
        assert buf.durable_seq("robot-0") == 3  # seq 4..6 are indexed, not yet durable
        assert buf.contains("robot-0", [3, 4, 6]).tolist() == [True, False, False]
        np.testing.assert_array_equal(buf.stored_seqs("robot-0"), [0, 1, 2, 3])
    finally:
        release.set()
        t.join(30)
    assert buf.durable_seq("robot-0") == 6
    assert buf.contains("robot-0", [3, 4, 6]).all()
    buf.close()
