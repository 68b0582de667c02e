"""Shards of one buffer: robots hashed to shards, each shard a whole buffer, sampling across
them in proportion to their sizes (in one process, over batch servers, and as Ray actors)."""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from buffer import BufferSettings, ReplayBuffer
from buffer.service.batches import BatchServer
from buffer.service.sharded_batches import ShardedRemoteBuffer
from buffer.service.shards import ShardedBuffer, shard_dir, shard_of
from foundation.rows import RowFilter
from tests.buffer.helpers import BATCH_TOKEN, episodes, obs_value, small_schema

SETTINGS = {"segment_target_bytes": 4096, "memory_budget_bytes": 1 << 24}


def _open(root: Path, shards: int = 2) -> ShardedBuffer:
    return ShardedBuffer.open(root, small_schema(), BufferSettings(**SETTINGS), shards=shards)


def _robots_in(shard: int, shards: int, count: int) -> list[int]:
    """Robot numbers (``robot-<n>``) whose ids hash to ``shard``."""
    found = [r for r in range(1000) if shard_of(f"robot-{r}", shards) == shard]
    return found[:count]


def test_a_robot_always_lands_in_the_same_shard() -> None:
    for r in range(200):
        rid = f"robot-{r}"
        k = shard_of(rid, 4)
        assert k == zlib.crc32(rid.encode()) % 4  # any process or node computes the same
        assert shard_of(rid, 4) == k
    assert {shard_of(f"robot-{r}", 4) for r in range(200)} == {0, 1, 2, 3}
    assert shard_of(7, 3) == shard_of("7", 3)  # integer ids are the buffer's strings


def test_rows_are_stored_in_their_robots_shard_only(tmp_path: Path) -> None:
    with _open(tmp_path / "b") as buf:
        robots = [*_robots_in(0, 2, 2), *_robots_in(1, 2, 2)]
        for r in robots:
            result = buf.append(episodes(r, [5, 5]))
            assert result.acked == {f"robot-{r}": 9}
        for r in robots:
            home = shard_of(f"robot-{r}", 2)
            assert buf.shards[home].stored_seqs(f"robot-{r}").tolist() == list(range(10))
            assert len(buf.shards[1 - home].stored_seqs(f"robot-{r}")) == 0
            assert buf.durable_seq(f"robot-{r}") == 9
            assert buf.contains(f"robot-{r}", np.arange(12)).tolist() == [True] * 10 + [False] * 2
        assert len(buf) == sum(len(s) for s in buf.shards) == 40


def test_a_batch_of_robots_in_two_shards_is_split_and_a_retry_stores_nothing_twice(
    tmp_path: Path,
) -> None:
    a, b = _robots_in(0, 2, 1)[0], _robots_in(1, 2, 1)[0]
    records = episodes(a, [4]) + episodes(b, [6])
    with _open(tmp_path / "b") as buf:
        first = buf.append(records)
        assert first.acked == {f"robot-{a}": 3, f"robot-{b}": 5}
        assert first.stored == 10
        again = buf.append(records)  # a retry after a lost acknowledgement
        assert again.stored == 0 and again.duplicates == 10
        assert buf.num_steps == 10


def test_reopen_recovers_each_shard_and_refuses_another_count(tmp_path: Path) -> None:
    root = tmp_path / "b"
    robots = [*_robots_in(0, 3, 2), *_robots_in(1, 3, 2), *_robots_in(2, 3, 2)]
    with _open(root, shards=3) as buf:
        for r in robots:
            buf.append(episodes(r, [7, 3]))
        mark = robots[0]
        buf.mark_episode(f"robot-{mark}", "run-a", 0, "discard")
        before = len(buf)
    assert sorted(p.name for p in root.iterdir()) == [
        "schema.json",  # the run's schema, where readers of a run directory look for it
        "shard-00",
        "shard-01",
        "shard-02",
        "shards.json",
    ]
    with pytest.raises(ValueError, match="shards"):
        ReplayBuffer.open(root)  # the root is not a buffer
    with ShardedBuffer.open(root) as again:  # the count and schema from disk
        assert len(again.shards) == 3
        assert len(again) == before
        for r in robots:
            assert again.stored_seqs(f"robot-{r}").tolist() == list(range(10))
        rows = again.select(RowFilter(robot_ids=(f"robot-{mark}",)))
        assert len(rows) == 3  # episode 0 (7 steps) discarded: episode 1's 3 transitions
    with pytest.raises(ValueError, match="resharding"):
        ShardedBuffer.open(root, None, BufferSettings(**SETTINGS), shards=2)
    single = ReplayBuffer.open(shard_dir(root, 1))  # a shard is a whole buffer on its own
    assert single.num_steps == 20
    single.close()


def test_a_new_sharded_buffer_needs_a_count(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="shard count"):
        ShardedBuffer.open(tmp_path / "b", small_schema())


def _uneven(buf: ShardedBuffer) -> None:
    """Three times the transitions in shard 0 as in shard 1."""
    for i, r in enumerate(_robots_in(0, 2, 3)):
        buf.append(episodes(r, [10] * 10, seq0=0, ep0=100 * i))
    buf.append(episodes(_robots_in(1, 2, 1)[0], [10] * 10))


def test_sampling_draws_from_shards_in_proportion_to_their_size(tmp_path: Path) -> None:
    with _open(tmp_path / "b") as buf:
        _uneven(buf)
        sizes = [len(s) for s in buf.shards]
        assert sizes[0] == 3 * sizes[1]
        rng = np.random.default_rng(0)
        shards = np.concatenate([buf.sample(64, rng=rng)["shard"] for _ in range(200)])
        assert abs(np.mean(shards == 0) - 0.75) < 0.02  # 12,800 draws: sd 0.004
        batch = buf.sample(256, rng=rng)
        for k in (0, 1):  # each row is its shard's own: state and action encode (robot, seq)
            mine = batch["shard"] == k
            robot = [int(r.split("-")[1]) for r in batch["robot_id"][mine]]
            rows = batch["index"][mine]
            seqs = buf.shards[k].index.view("seq")[rows - buf.shards[k].index.base]
            want = [obs_value(r, int(s)) for r, s in zip(robot, seqs, strict=True)]
            np.testing.assert_array_equal(batch["observation.state"][mine][:, 0], want)


def test_a_shard_whose_sampler_finds_nothing_hands_its_share_on(tmp_path: Path) -> None:
    from buffer import InterventionSampler

    with _open(tmp_path / "b") as buf:
        r0, r1 = _robots_in(0, 2, 1)[0], _robots_in(1, 2, 1)[0]
        buf.append(episodes(r0, [10, 10]))  # no interventions in shard 0
        buf.append(episodes(r1, [10, 10], intervention=True))
        batch = buf.sample(32, InterventionSampler(), rng=np.random.default_rng(1))
        assert len(batch["shard"]) == 32 and (batch["shard"] == 1).all()
        assert batch["is_intervention"].all()


def test_remote_shards_sample_in_proportion_to_their_size(tmp_path: Path) -> None:
    # One batch server per shard, as on separate nodes; the learner's client spans them.
    with _open(tmp_path / "b") as buf:
        _uneven(buf)
        servers = [BatchServer(s, ["reach"], token=BATCH_TOKEN) for s in buf.shards]
        remote = ShardedRemoteBuffer(
            [s.address for s in servers], timeout_s=10, seed=0, token=BATCH_TOKEN
        )
        try:
            assert remote.num_transitions() == len(buf)
            online = sum(s._sizes()["online"] for s in servers)  # noqa: SLF001
            assert remote.online_transitions() == online
            got = [remote.sample(64) for _ in range(100)]
            shards = np.concatenate([g["shard"] for g in got])
            assert abs(np.mean(shards == 0) - 0.75) < 0.03  # 6,400 draws: sd 0.005
            assert all(len(g["task_index"]) == 64 for g in got)
            state = remote.sampler_state()
            assert len(state["shards"]) == 2
            remote.load_sampler_state(state)
        finally:
            remote.close()
            for s in servers:
                s.close()


@pytest.fixture(scope="module")
def ray_local() -> Iterator[None]:
    import ray

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.slow
def test_shards_as_ray_actors(tmp_path: Path, ray_local: None) -> None:
    import ray

    from buffer.service.shard_actor import start_shards

    schema = small_schema()
    actors = start_shards(
        tmp_path / "b", 2, schema, BufferSettings(**SETTINGS), ["reach"], token=BATCH_TOKEN
    )
    try:
        for r in range(6):
            rid = f"robot-{r}"
            sink = pa.BufferOutputStream()
            batch = schema.batch_from_records(episodes(r, [5, 5]))
            with pa.ipc.new_stream(sink, batch.schema) as w:
                w.write_batch(batch)
            acked = ray.get(
                actors[shard_of(rid, 2)].append_ipc.remote(sink.getvalue().to_pybytes())
            )
            assert acked == {rid: 9}
            assert ray.get(actors[shard_of(rid, 2)].durable_seq.remote(rid)) == 9
        sizes = ray.get([a.size.remote() for a in actors])
        assert sum(sizes) == 6 * 10
        addresses = ray.get([a.address.remote() for a in actors])
        remote = ShardedRemoteBuffer(addresses, seed=0, token=BATCH_TOKEN)
        try:
            batch = remote.sample(50)
            assert len(batch["shard"]) == 50 and set(batch["shard"].tolist()) <= {0, 1}
        finally:
            remote.close()
    finally:
        ray.get([a.close.remote() for a in actors])


def test_remote_shards_skip_a_shard_whose_sampler_finds_nothing(tmp_path: Path) -> None:
    from buffer import InterventionSampler
    from buffer.service.batches import RemoteNothingToSample

    with _open(tmp_path / "b") as buf:
        r0, r1 = _robots_in(0, 2, 1)[0], _robots_in(1, 2, 1)[0]
        buf.append(episodes(r0, [10, 10]))  # no interventions in shard 0
        servers = [
            BatchServer(s, ["reach"], InterventionSampler(), token=BATCH_TOKEN) for s in buf.shards
        ]
        remote = ShardedRemoteBuffer(
            [s.address for s in servers], timeout_s=10, seed=0, token=BATCH_TOKEN
        )
        try:
            with pytest.raises(RemoteNothingToSample):  # none in any shard: the learner waits
                remote.sample(8)
            buf.append(episodes(r1, [10, 10], intervention=True))
            time.sleep(1.1)  # sizes are cached for up to a second
            batch = remote.sample(16)
            assert (batch["shard"] == 1).all() and batch["is_intervention"].all()
        finally:
            remote.close()
            for s in servers:
                s.close()


def test_the_upload_sink_takes_the_shards_as_one_buffer(tmp_path: Path) -> None:
    # comms' ReplayBufferSink only appends, looks up durable seqs and marks episodes.
    from comms.cloud.replay_buffer_sink import ReplayBufferSink

    with _open(tmp_path / "b") as buf:
        sink = ReplayBufferSink(buf)  # type: ignore[arg-type]
        schema = small_schema()
        for r in range(4):
            steps = [{**rec, "robot_id": str(r)} for rec in episodes(r, [6])]  # enrolled ids
            assert sink.append(r, schema.batch_from_records(steps)) == 5
            assert sink.durable_seq(r) == 5
            assert len(buf.shard_for(str(r)).stored_seqs(str(r))) == 6
        assert buf.num_steps == 24


def test_the_episodes_people_labelled_come_from_every_shard(tmp_path: Path) -> None:
    # A classifier run's learner asks its sharded buffer for the labelled episodes.
    with _open(tmp_path / "b") as buf:
        r0, r1 = _robots_in(0, 2, 1)[0], _robots_in(1, 2, 1)[0]
        buf.append(episodes(r0, [4, 6]))
        buf.append(episodes(r1, [5]))
        buf.mark_episode(f"robot-{r0}", "run-a", 1, "success", "Keyboard")
        buf.mark_episode(f"robot-{r1}", "run-a", 0, "failure", "Keyboard")
        buf.mark_episode(f"robot-{r0}", "run-a", 0, "success", "driver")  # no person's label
        servers = [BatchServer(s, ["reach"], token=BATCH_TOKEN) for s in buf.shards]
        remote = ShardedRemoteBuffer([s.address for s in servers], timeout_s=10, token=BATCH_TOKEN)
        try:
            found, arrays = remote.labelled_episodes()
        finally:
            remote.close()
            for s in servers:
                s.close()
    got = sorted((e["robot_id"], e["episode_index"], e["verdict"], e["steps"]) for e in found)
    assert got == [(f"robot-{r0}", 1, "success", 6), (f"robot-{r1}", 0, "failure", 5)]
    assert len(arrays["frame_index"]) == 11
    # The arrays follow the episodes' order: each episode's frames count from 0.
    starts = np.cumsum([0] + [e["steps"] for e in found[:-1]])
    assert (arrays["frame_index"][starts] == 0).all()


def test_prefetch_draws_the_next_batch_while_the_learner_trains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _open(tmp_path / "b") as buf:
        for r in (*_robots_in(0, 2, 1), *_robots_in(1, 2, 1)):
            buf.append(episodes(r, [10, 10]))
        slow = buf.shards[1]
        draw = slow.sample

        def slow_sample(*args: object, **kw: object) -> dict[str, np.ndarray]:
            time.sleep(0.4)  # a shard on a busy node
            return draw(*args, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr(slow, "sample", slow_sample)
        servers = [BatchServer(s, ["reach"], token=BATCH_TOKEN) for s in buf.shards]
        remote = ShardedRemoteBuffer(
            [s.address for s in servers],
            timeout_s=10,
            seed=0,
            prefetch=True,
            token=BATCH_TOKEN,
        )
        try:
            assert len(remote.sample(32)["shard"]) == 32  # the first waits for the slow shard
            time.sleep(0.6)  # the learner's update: the next batch is drawn meanwhile
            t0 = time.monotonic()
            batch = remote.sample(32)
            assert time.monotonic() - t0 < 0.2 and len(batch["shard"]) == 32
            assert set(batch["shard"].tolist()) == {0, 1}
            assert len(remote.sample(8)["shard"]) == 8  # another size is drawn for it
        finally:
            remote.close()
            for s in servers:
                s.close()


def test_each_shard_gets_its_part_of_the_budget_and_limits() -> None:
    from buffer.service.shards import shard_settings

    whole = BufferSettings(
        memory_budget_bytes=1 << 24,
        capacity_bytes=4000,
        capacity_transitions=0,
        retention_max_bytes=10_000,
    )
    part = shard_settings(whole, 4)
    assert part.memory_budget_bytes == 1 << 22
    assert (part.capacity_bytes, part.retention_max_bytes) == (1000, 2500)
    assert part.capacity_transitions == 0  # no limit stays no limit
    assert part.segment_target_bytes == whole.segment_target_bytes


def test_the_latest_policy_episodes_come_from_every_shard(tmp_path: Path) -> None:
    # A help probe's learner asks its sharded buffer for the episodes a policy acted in.
    with _open(tmp_path / "b") as buf:
        r0, r1 = _robots_in(0, 2, 1)[0], _robots_in(1, 2, 1)[0]
        buf.append(episodes(r0, [4, 6], policy_version=1))
        buf.append(episodes(r1, [5, 3], policy_version=1))
        servers = [BatchServer(s, ["reach"], token=BATCH_TOKEN) for s in buf.shards]
        remote = ShardedRemoteBuffer([s.address for s in servers], timeout_s=10, token=BATCH_TOKEN)
        try:
            found, arrays = remote.policy_episodes(3)
        finally:
            remote.close()
            for s in servers:
                s.close()
    got = [(e["robot_id"], e["episode_index"], e["steps"]) for e in found]
    # Shard 0 gives its latest 2, shard 1 its latest 1: the limit holds over the shards.
    assert got == [(f"robot-{r0}", 0, 4), (f"robot-{r0}", 1, 6), (f"robot-{r1}", 1, 3)]
    assert len(arrays["is_intervention"]) == 13
