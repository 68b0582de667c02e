"""``bench buffer --learner-view`` at tiny sizes: real shard actors, robots appending through
``ShardActors.append`` and a prefetching ``ShardedRemoteBuffer`` learner, with real figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from buffer import BufferSettings
from buffer.bench.learner_view import ViewConfig, bench_learner_view, robot_names
from buffer.bench.report import learner_rows
from buffer.service.shards import shard_of

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_robot_names_spread_over_every_shard_count() -> None:
    names = robot_names(8, (1, 2, 4))
    assert names == [f"robot-{i}" for i in range(8)]
    two = robot_names(2, (1, 2))
    assert sorted(shard_of(n, 2) for n in two) == [0, 1]


def test_learner_view_figures_at_tiny_sizes(tmp_path: Path) -> None:
    cfg = ViewConfig(
        shard_counts=(1, 2),
        robots=2,
        chunk=8,
        robot_hz=40.0,
        prefill_chunks=4,
        batch=32,
        learner_hz=50.0,
        seconds=0.5,
        rounds=1,
        cameras={"front": (8, 8, 3)},
        settings=BufferSettings(memory_budget_bytes=1 << 26, segment_target_bytes=1 << 16),
    )
    r = bench_learner_view(tmp_path, cfg)
    assert r["learner_gather_ms"] > 0 and r["learner_hz"] == 50.0
    assert r["learner_batch_mb"] > 0
    for k in (1, 2):
        assert r[f"learner_batches_per_s_{k}"] > 0
        assert r[f"learner_mb_per_s_{k}"] > 0
        assert 0.0 <= r[f"learner_wait_fraction_{k}"] <= 1.0
        # One update takes 1/50 s: the learner cannot pass 50 updates/s.
        assert 0 < r[f"learner_updates_per_s_{k}"] <= 50.0
        assert r[f"learner_wait_p50_ms_{k}"] <= r[f"learner_wait_p99_ms_{k}"]
        assert r[f"learner_ratio_vs_gather_{k}"] > 0
        # The prefill (2 robots x 4 appends of 8) and what the robots recorded while sampling.
        assert r[f"learner_rows_{k}"] > 2 * 4 * 8
        assert r[f"learner_robot_steps_per_s_{k}"] > 0
        # Rows are drawn from each shard in proportion to its size (one robot in each).
        assert r[f"learner_share_dev_{k}"] < 0.15
        # The shards run in Ray's worker processes on this machine: their batches arrive in
        # the learner's shared memory (all but the first of each client and a warm-up's).
        assert r[f"learner_slot_share_{k}"] > 0.5
        # The same learner over the socket, beside it.
        assert r[f"learner_socket_ms_per_batch_{k}"] > 0
        assert 0.0 <= r[f"learner_socket_wait_fraction_{k}"] <= 1.0
        assert 0 < r[f"learner_socket_updates_per_s_{k}"] <= 50.0
    rows = learner_rows(r, (1, 2))
    assert len(rows) == 6 and rows[4][-1] == "< 5 %" and "2 shards" in rows[3][0]
    assert "over the socket" in rows[5][0]
