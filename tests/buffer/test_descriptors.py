"""Segment files' read descriptors stay bounded (``buffer.files.descriptors``)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from buffer.files import descriptors
from buffer.files.descriptors import DescriptorCache
from tests.buffer.helpers import episodes, open_buffer


def _open_files(under: Path) -> list[str]:
    """Paths (as the kernel names them) of this process's descriptors into ``under``."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(under)):
            out.append(target)
    return out


def test_reads_of_many_cold_segments_keep_at_most_the_limit_open(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(descriptors.DESCRIPTORS, "limit", 6)
    row = 6 * 5 * 3 + 3 * 4 + 2 * 4 * 3  # the small schema's payload bytes per row
    with open_buffer(
        tmp_path / "b", memory_budget_bytes=20 * row, segment_target_bytes=10 * row
    ) as buf:
        for e in range(40):
            buf.append(episodes(0, [10], seq0=10 * e, ep0=e))
        buf.flush()
        segments = list((tmp_path / "b").glob("seg-*"))
        assert len(segments) > 20  # segments x 4 stripes would be far over the limit
        rng = np.random.default_rng(0)
        for _ in range(60):
            batch = buf.sample(64, rng=rng)
            assert batch["observation.state"].shape == (64, 3)
        assert buf.stats()["cache_hit_rate"] < 1.0  # cold segments were read
        open_segments = [p for p in _open_files(tmp_path / "b") if "/seg-" in p]
        assert 0 < len(open_segments) <= 6


def test_a_deleted_segment_leaves_no_descriptor_holding_its_space(tmp_path) -> None:
    row = 6 * 5 * 3 + 3 * 4 + 2 * 4 * 3
    with open_buffer(
        tmp_path / "b",
        memory_budget_bytes=20 * row,
        segment_target_bytes=10 * row,
        retention_max_bytes=60 * row,
    ) as buf:
        rng = np.random.default_rng(0)
        for e in range(40):
            buf.append(episodes(0, [10], seq0=10 * e, ep0=e))
            buf.sample(32, rng=rng)  # reads cold segments that retention deletes later
        buf.flush()
        assert buf.first_row > 0
        deleted = [p for p in _open_files(tmp_path / "b") if p.endswith("(deleted)")]
        assert deleted == []


def test_the_cache_closes_the_least_recently_used_never_one_in_use(tmp_path) -> None:
    files = []
    for i in range(5):
        p = tmp_path / f"f{i}"
        p.write_bytes(bytes([i]) * 8)
        files.append(str(p))
    cache = DescriptorCache(limit=2)
    with cache.open("a", files[0]) as fd0:  # in use throughout
        for i in range(1, 5):
            with cache.open(i, files[i]) as fd:
                assert os.pread(fd, 1, 0) == bytes([i])
        assert os.pread(fd0, 1, 0) == bytes([0])  # not closed under its reader
        assert len(cache) == 2
    assert cache.opens == 5
    with cache.open(4, files[4]):  # the most recent one is still open: no new open
        pass
    assert cache.opens == 5


def test_a_forgotten_descriptor_closes_when_its_read_ends(tmp_path) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"x")
    cache = DescriptorCache(limit=4)
    with cache.open("k", str(p)) as fd:
        cache.forget(["k"])
        assert os.pread(fd, 1, 0) == b"x"  # still open for the read in flight
    with pytest.raises(OSError):
        os.fstat(fd)  # closed by the read's end
    assert len(cache) == 0
