"""A LeRobot gateway in a sharded run uploads to its buffer shard's own ingest endpoint (the
route its assignment carries), not to the cloud; an assignment whose route does not parse is
refused by name. Real shard endpoints and replay buffers, LeRobot's own actor-side code."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from buffer import ReplayBuffer
from buffer.service.shards import shard_of
from comms.cloud.shard_ingest import ShardIngest
from comms.cloud.shard_routes import ShardRoutes
from comms.wire import tickets
from edge_agent.assignment import Assignment
from edge_agent.lerobot_gateway.features import actor_config
from edge_agent.lerobot_gateway.gateway import LeRobotGateway
from tests.edge_agent.lerobot_actor import Actor, sac_version, transition
from tests.edge_agent.test_lerobot_gateway import CONFIG, start_gateway
from tests.fakes.cloud import RUN, Cloud
from tests.fakes.procs import wait_until
from tests.fakes.settings import fast_comms

pytestmark = pytest.mark.timeout(300)

SHARDS = 2


class ShardedCloud:
    """A cloud whose run ``RUN`` has ``SHARDS`` buffer shards in the gateway's schema, each
    with its own ingest endpoint on loopback, and a gateway enrolled with it."""

    def __init__(self, root: Path, store: object) -> None:
        key = tickets.new_key()
        schema = actor_config(CONFIG).schema()
        self.buffers = [ReplayBuffer.open(root / f"shard-{k}", schema) for k in range(SHARDS)]
        start = ShardIngest(fast_comms(), RUN, key, host="127.0.0.1")
        self.servers = [start(b, k, root / f"shard-{k}") for k, b in enumerate(self.buffers)]
        self.routes = ShardRoutes(RUN, key, SHARDS, lambda: [s.address for s in self.servers])
        self.cloud: Cloud = Cloud(  # type: ignore[type-arg]
            store,  # type: ignore[arg-type]
            settings=fast_comms(),
            routes=lambda run: self.routes if run == RUN else None,
        )
        self.gateway: LeRobotGateway
        self.runner: threading.Thread
        self.gateway, self.runner = start_gateway(self.cloud, root, "so101-a")

    def assign(self, ingest: dict[str, object]) -> None:
        rid = self.gateway.robot_id
        self.cloud.store.lease_robots(RUN, [rid])
        text = Assignment(
            run_id=RUN, tasks=["pick_cube"], max_episode_steps=100, ingest=ingest
        ).to_json()
        wait_until(
            lambda: self.cloud.server.push_control(rid, "assign", run_id=RUN, assignment=text),
            20,
            "the gateway's Control stream",
        )

    def close(self) -> None:
        self.gateway.stop()
        self.runner.join(20)
        self.cloud.close()
        for s in self.servers:
            s.stop()
        for b in self.buffers:
            b.close()


@pytest.fixture
def lab(tmp_path: Path, db) -> Iterator[ShardedCloud]:  # type: ignore[no-untyped-def]
    _url, store = db
    lab = ShardedCloud(tmp_path, store)
    try:
        yield lab
    finally:
        lab.close()


def test_a_gateway_in_a_sharded_run_uploads_to_its_shard(lab: ShardedCloud) -> None:
    rid = lab.gateway.robot_id
    home = shard_of(rid, SHARDS)
    lab.assign(lab.routes.route_dict(rid, "so101-a"))
    lab.cloud.server.distributor(RUN).publish(sac_version(), version=1)
    actor = Actor(lab.gateway.port)
    assert actor.ready(attempts=3)
    actor.start_streams()
    try:
        actor.parameters.get(timeout=20)
        s, a = torch.arange(4, dtype=torch.float32), torch.tensor([0.1, -0.2])
        actor.send_transitions(
            [transition(s + i, a, intervention=i == 1, done=i == 4) for i in range(5)]
        )
        wait_until(
            lambda: lab.buffers[home].num_steps == 5,
            30,
            lambda: f"shard {home} holds {lab.buffers[home].num_steps} steps",
        )
    finally:
        actor.close()
    assert lab.buffers[1 - home].num_steps == 0
    assert lab.cloud.server.uploaded_rows(RUN) == 0  # nothing through the cloud's ingest
    assert lab.servers[home].figures()["rows"] == 5


def test_an_assignment_whose_route_does_not_parse_is_refused_by_name(lab: ShardedCloud) -> None:
    lab.assign({"address": "127.0.0.1:1", "ticket": "t"})  # no shard, no expiry
    wait_until(lambda: lab.gateway._refused is not None, 20, "the refusal")
    refused = lab.gateway._refused
    assert refused is not None and refused[0] == RUN
    assert "assignment ingest" in refused[1]
    assert lab.gateway.state.run is None
