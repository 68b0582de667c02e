"""Capacity (online window in transitions and bytes) and retention on disk."""

from __future__ import annotations

import numpy as np
import pytest

from buffer import ReplayBuffer, SegmentGoneError, UniformSampler
from buffer.sampling.view import Picks, SamplingView
from tests.buffer.helpers import episodes, open_buffer


def test_window_in_transitions_keeps_disk(tmp_path) -> None:
    with open_buffer(tmp_path / "b", capacity_transitions=30) as buf:
        buf.append(episodes(0, [10] * 10))
        lo, hi = buf.window()
        assert (lo, hi) == (70, 100)
        assert len(buf) == 30
        b = buf.sample(200, rng=np.random.default_rng(0))
        assert b["index"].min() >= 70
        assert buf.num_steps == 100  # leaving the window deletes nothing
    with ReplayBuffer.open(tmp_path / "b") as again:
        assert again.num_steps == 100


def test_window_in_bytes(tmp_path) -> None:
    with open_buffer(tmp_path / "b") as buf:
        row = buf.storage.row_bytes
    with open_buffer(tmp_path / "c", capacity_bytes=row * 25) as buf:
        buf.append(episodes(0, [10] * 10))
        lo, hi = buf.window()
        assert hi - lo == 25


def test_retention_deletes_oldest_segments_and_reports_disk(tmp_path) -> None:
    with open_buffer(tmp_path / "b", segment_target_bytes=1300, retention_max_bytes=6000) as buf:
        for e in range(30):
            buf.append(episodes(0, [10], seq0=10 * e, ep0=e))
        buf.flush()
        segs = sorted((tmp_path / "b").glob("seg-*"))
        on_disk = sum(p.stat().st_size for p in segs)
        assert on_disk <= 6000 + max(p.stat().st_size for p in segs)
        assert buf.first_row > 0
        st = buf.stats()
        assert st["bytes_on_disk"] >= on_disk
        b = buf.sample(100, rng=np.random.default_rng(1))
        assert b["index"].min() >= buf.first_row
    with ReplayBuffer.open(tmp_path / "b") as again:
        assert again.first_row > 0
        assert again.visible == 300
        assert again.num_steps == 300 - again.first_row


class _PicksThenRetention(UniformSampler):
    """Picks rows of the oldest stored segment, then (on its first call only) appends until
    retention deletes that segment: the race between a sample's picks and its read, made
    certain (it happens by chance when the sealer's thread applies retention mid-sample)."""

    def __init__(self, buf: ReplayBuffer) -> None:
        super().__init__()
        self.buf, self.calls = buf, 0

    def sample_indices(
        self, view: SamplingView, batch_size: int, rng: np.random.Generator
    ) -> Picks:
        self.calls += 1
        if self.calls > 1:
            return super().sample_indices(view, batch_size, rng)
        first = self.buf.first_row
        rows = np.arange(first, first + batch_size, dtype=np.int64)
        for e in range(30, 40):
            self.buf.append(episodes(0, [10], seq0=10 * e, ep0=e))
        self.buf.flush()
        assert self.buf.first_row > rows.max()  # every picked row's segment is deleted
        return [(view.online, rows, np.ones(batch_size))]


def test_a_sample_whose_rows_retention_deleted_is_drawn_again(tmp_path) -> None:
    with open_buffer(tmp_path / "b", segment_target_bytes=1300, retention_max_bytes=6000) as buf:
        for e in range(30):
            buf.append(episodes(0, [10], seq0=10 * e, ep0=e))
        buf.flush()
        sampler = _PicksThenRetention(buf)
        b = buf.sample(5, sampler, rng=np.random.default_rng(0))
        assert sampler.calls == 2  # drawn again from the window left
        assert b["index"].min() >= buf.first_row
        with pytest.raises(SegmentGoneError, match="no longer stored"):
            buf.read_transitions(np.arange(0, 5, dtype=np.int64))  # the lower-level read


def test_history_reaching_rows_retention_deleted_is_padding_not_an_error(tmp_path) -> None:
    """Episodes of 25 steps across small segments: once retention deletes the oldest ones,
    the first stored episode has lost its start, and history windows of its early rows
    reach deleted rows. They are padded (mask False), never read."""
    with open_buffer(tmp_path / "b", segment_target_bytes=1300, retention_max_bytes=6000) as buf:
        rows = episodes(0, [25] * 12)
        for k in range(0, len(rows), 10):  # appends of 10 rows: segments cut episodes
            buf.append(rows[k : k + 10])
        buf.flush()
        first = buf.first_row
        assert first % 25 != 0, "retention cut an episode (the case under test)"
        rng = np.random.default_rng(0)
        for _ in range(200):
            s = buf.sample_sequences(16, 6, history=3, rng=rng)
            assert s["mask"].shape == (16, 9)
        # the row right after the cut: its whole history is gone, so it is padding
        seq = buf.read_sequences(np.array([first], dtype=np.int64), 6, 3)
        assert seq["mask"][0].tolist() == [False] * 3 + [True] * 6
