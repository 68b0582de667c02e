"""The cloud records each run event of a shard's ingest endpoint once, and again from 0 for a
restarted shard process (``runs.sharded.new_endpoint_events``)."""

from __future__ import annotations

from typing import Any

from runs.sharded import new_endpoint_events


def _figures(*kinds: str, shard: int = 0) -> dict[str, Any]:
    return {
        "address": "127.0.0.1:1",
        "events": [{"n": i, "kind": k, "data": {"shard": shard}} for i, k in enumerate(kinds)],
    }


def test_each_event_once_and_a_restarted_shards_from_its_start() -> None:
    seen: dict[int, tuple[int, int]] = {}
    full = _figures("buffer.disk_full")
    assert new_endpoint_events([full, None], [10, 11], seen) == [("buffer.disk_full", {"shard": 0})]
    assert new_endpoint_events([full, None], [10, 11], seen) == []  # read again: nothing new
    both = _figures("buffer.disk_full", "buffer.disk_recovered")
    assert new_endpoint_events([both, None], [10, 11], seen) == [
        ("buffer.disk_recovered", {"shard": 0})
    ]
    # Ray restarted shard 0 (another pid): its endpoint numbers its events from 0 again.
    assert new_endpoint_events([full, None], [12, 11], seen) == [("buffer.disk_full", {"shard": 0})]
