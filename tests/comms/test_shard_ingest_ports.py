"""A shard's ingest endpoint inside a fixed port range (``comms.shard_ingest_port``), as a
firewall or a hostNetwork pod needs: shards of one node take successive free ports of the
range, a restarted shard takes its own port again, and a full range refuses by name instead
of binding a port outside it."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from buffer import ReplayBuffer
from comms.cloud.shard_ingest import ShardIngest, ShardIngestServer, ports_to_try
from comms.wire import tickets
from tests.comms.helpers import BUFFER_SCHEMA
from tests.fakes.cloud import RUN
from tests.fakes.settings import fast_comms


def _free_block(size: int) -> int:
    """A first port with ``size`` ports free from it on loopback (as far as can be told)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            first = int(s.getsockname()[1])
        if first + size > 65535:
            continue
        free = True
        for p in range(first, first + size):
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", p))
                except OSError:
                    free = False
                    break
        if free:
            return first
    raise RuntimeError("no free block of ports on loopback")


def test_ports_to_try_keeps_the_old_port_and_stays_inside_the_range() -> None:
    assert ports_to_try(fast_comms(), 0) == [0]
    assert ports_to_try(fast_comms(), 41000) == [41000, 0]
    ranged = fast_comms(shard_ingest_port=41000, shard_ingest_ports=4)
    assert ports_to_try(ranged, 0) == [41000, 41001, 41002, 41003]
    assert ports_to_try(ranged, 41002) == [41002, 41000, 41001, 41003]
    assert ports_to_try(ranged, 50000) == [41000, 41001, 41002, 41003]  # outside: not tried
    top = fast_comms(shard_ingest_port=65534, shard_ingest_ports=8)
    assert ports_to_try(top, 0) == [65534, 65535]


def test_shards_of_a_node_share_the_range_and_a_full_range_refuses(tmp_path: Path) -> None:
    first = _free_block(2)
    settings = fast_comms(shard_ingest_port=first, shard_ingest_ports=2)
    key = tickets.new_key()
    start = ShardIngest(settings, RUN, key, host="127.0.0.1")
    buffers = [ReplayBuffer.open(tmp_path / f"shard-{k}", BUFFER_SCHEMA) for k in range(3)]
    servers: list[ShardIngestServer] = []
    try:
        servers = [start(buffers[k], k, tmp_path / f"shard-{k}") for k in range(2)]
        assert sorted(s.port for s in servers) == [first, first + 1]
        # Each shard keeps the port it took, for the next start.
        for k, s in enumerate(servers):
            assert (tmp_path / f"shard-{k}" / "ingest_port").read_text() == str(s.port)
        with pytest.raises(RuntimeError, match=rf"{first}-{first + 1} \(comms.shard_ingest_port"):
            start(buffers[2], 2, tmp_path / "shard-2")
        assert not (tmp_path / "shard-2" / "ingest_port").exists()
        # A restarted shard binds its own port again.
        kept = servers[1].port
        servers[1].stop()
        servers[1] = start(buffers[1], 1, tmp_path / "shard-1")
        assert servers[1].port == kept
    finally:
        for s in servers:
            s.stop()
        for b in buffers:
            b.close()
