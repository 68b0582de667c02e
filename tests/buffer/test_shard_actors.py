"""A run's buffer as shard actors seen from the cloud (``ShardActors``): appends routed by
robot, lookups, marks, counts, offline mounts in every shard, and a shard process SIGKILLed
and restarted by Ray that recovers everything it acknowledged on the same batch address."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from buffer import BackpressureError, BufferSettings
from buffer.service.shard_client import ShardActors
from buffer.service.sharded_batches import ShardedRemoteBuffer
from buffer.service.shards import shard_dir, shard_of
from foundation.rows import RowFilter
from tests.buffer.helpers import episodes, open_buffer, small_schema

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
SETTINGS = BufferSettings(segment_target_bytes=4096, memory_budget_bytes=1 << 24)


@pytest.fixture(scope="module")
def ray_local() -> Iterator[None]:
    import ray

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _robot_in(shard: int, after: int = 0) -> int:
    return next(r for r in range(after, 1000) if shard_of(f"robot-{r}", 2) == shard)


def _append_when_back(shards: ShardActors, records: Any, timeout_s: float = 90.0) -> Any:
    """What a robot does while its shard is away: send again after the refusal's wait."""
    deadline = time.monotonic() + timeout_s
    schema = small_schema()
    while True:
        try:
            return shards.append(schema.batch_from_records(records))
        except BackpressureError as exc:
            assert time.monotonic() < deadline, f"the shard never came back: {exc}"
            time.sleep(exc.retry_after_s)


def test_shard_actors_route_count_mount_and_survive_a_sigkill(
    tmp_path: Path, ray_local: None
) -> None:
    import ray

    schema = small_schema()
    with open_buffer(tmp_path / "offline", schema) as offline:
        offline.append(episodes(99, [5, 5]))
    events: list[tuple[str, dict[str, Any]]] = []
    shards = ShardActors.start(
        tmp_path / "b",
        2,
        schema,
        SETTINGS,
        ["reach"],
        mounts=[(str(tmp_path / "offline"), RowFilter(), "earlier", None)],
        on_event=lambda kind, data: events.append((kind, data)),
    )
    try:
        a, b = _robot_in(0), _robot_in(1)
        for r in (a, b):
            result = shards.append(schema.batch_from_records(episodes(r, [5, 5])))
            assert result.acked == {f"robot-{r}": 9} and result.stored == 10
        # Each robot's rows are in its own shard only.
        assert shards.durable_seq(f"robot-{a}") == 9
        for r, other in ((a, 1), (b, 0)):
            elsewhere = ray.get(shards.actors[other].seqs.remote(f"robot-{r}", np.arange(10)))
            assert not elsewhere["contains"].any() and len(elsewhere["stored"]) == 0
        assert shard_dir(tmp_path / "b", 1).is_dir()
        assert shards.contains(f"robot-{b}", np.arange(12)).tolist() == [True] * 10 + [False] * 2
        assert shards.stored_seqs(f"robot-{a}").tolist() == list(range(10))
        shards.refresh()  # the figures are cached for half a second
        assert len(shards) == 20
        assert shards.count(RowFilter(robot_ids=(f"robot-{a}",))) == 10
        assert [len(v) for v in shards.offline] == [10] and shards.offline[0].name == "earlier"
        assert shards.mark_episode(f"robot-{b}", "run-a", 1, "discard") == 5
        assert shards.stats()["shards"] == 2

        # SIGKILL shard 0's process: Ray starts it again, it recovers from its WAL.
        pid0 = shards.pids[0]
        os.kill(pid0, signal.SIGKILL)
        more = episodes(a, [5], seq0=10, ep0=2)
        got = _append_when_back(shards, more)
        assert got.acked == {f"robot-{a}": 14}
        assert shards.contains(f"robot-{a}", np.arange(15)).all()  # nothing acknowledged lost
        shards.refresh()
        assert shards.pids[0] != pid0
        assert ("buffer.shard_restarted", {"shard": 0, "pid": shards.pids[0], "was": pid0}) in (
            events
        )
        # Its batch server is back on its address: the learner's sockets find it again.
        remote = ShardedRemoteBuffer(
            shards.addresses, timeout_s=20, seed=0, prefetch=True, token=shards.token
        )
        try:
            for _ in range(3):
                batch = remote.sample(32)
                assert len(batch["shard"]) == 32
            assert set(batch["shard"].tolist()) <= {0, 1}
        finally:
            remote.close()

        # Shard 1 dies while another process holds its port: it comes back on another one.
        was, pid1 = shards.addresses[1], shards.pids[1]
        with socket.socket() as taken:
            os.kill(pid1, signal.SIGKILL)
            _hold(taken, int(was.rsplit(":", 1)[1]))
            got = _append_when_back(shards, episodes(b, [5], seq0=10, ep0=2))
            assert got.acked == {f"robot-{b}": 14}
            shards.refresh()
            assert shards.pids[1] != pid1 and shards.addresses[1] != was
            remote = ShardedRemoteBuffer(shards.addresses, timeout_s=20, seed=0, token=shards.token)
            try:
                assert len(remote.sample(16)["shard"]) == 16
            finally:
                remote.close()
    finally:
        shards.close()


def _hold(sock: socket.socket, port: int, timeout_s: float = 10.0) -> None:
    """Listen on ``port`` as soon as its dead owner's socket is gone. SO_REUSEADDR, as the
    shard's own listener (libzmq) has: without it the dead server's connections in TIME_WAIT
    keep the port from this socket while Ray's restart of the shard binds it first."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
            return
        except OSError:
            assert time.monotonic() < deadline, f"port {port} stayed taken"
            time.sleep(0.01)
