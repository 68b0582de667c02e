"""Where a sharded run's shard actors go and where their batch servers listen
(``buffer.shard_resource``, ``buffer.shard_batch_host``): the options Ray gets, without a
cluster."""

from __future__ import annotations

import pytest

from buffer.config import BufferSettings
from buffer.service import shard_actor
from buffer.service.shard_actor import NODE_HOST, batch_host
from buffer.service.shard_client import most_shards_on_a_node, placement


def test_a_shard_resource_places_each_shard_on_a_node_that_advertises_it() -> None:
    assert placement(BufferSettings()) == {}
    assert placement(BufferSettings(shard_resource="robofleet/buffer")) == {
        "resources": {"robofleet/buffer": 1}
    }


def test_the_batch_server_listens_on_loopback_or_on_the_shards_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert BufferSettings().shard_batch_host == "127.0.0.1"
    assert batch_host("127.0.0.1") == "127.0.0.1"
    assert batch_host("10.1.2.3") == "10.1.2.3"
    import ray.util

    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "10.4.5.6")
    assert batch_host(NODE_HOST) == "10.4.5.6"
    assert shard_actor.NODE_HOST == "node"


def test_the_most_shards_a_node_may_host_is_what_its_nodes_advertise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """(the bound the run's ingest port range is checked against, ``runs.learning``)"""
    import ray

    nodes = [
        {"Alive": True, "Resources": {"CPU": 16.0, "robofleet/buffer": 6.0}},
        {"Alive": True, "Resources": {"CPU": 16.0}},
        {"Alive": False, "Resources": {"robofleet/buffer": 9.0}},  # gone: not counted
    ]
    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    on = BufferSettings(shard_resource="robofleet/buffer")
    assert most_shards_on_a_node(on, 24) == 6
    assert most_shards_on_a_node(on, 4) == 4
    assert most_shards_on_a_node(BufferSettings(), 24) == 24  # Ray may place all together
    nodes[0]["Alive"] = False
    assert most_shards_on_a_node(on, 24) == 0  # none advertises it yet: not knowable
