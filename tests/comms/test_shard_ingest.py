"""A buffer shard's own ingest endpoint over real gRPC into a real replay buffer: tickets
refused by name, a robot's uploads reaching its shard without the cloud's ingest, and a
shard endpoint that goes away and comes back on another port."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from buffer import ReplayBuffer
from buffer.service.shards import shard_of
from comms.cloud.replay_buffer_sink import ReplayBufferSink
from comms.cloud.shard_ingest import ShardIngest, ShardIngestServer
from comms.cloud.shard_routes import ShardRoutes
from comms.proto import robofleet_pb2 as pb
from comms.proto import robofleet_pb2_grpc as rpc
from comms.robot.client import make_channel
from comms.robot.shard_route import ShardRouter
from comms.robot.uploader import MemorySpool, Uploader
from comms.wire import steps as S
from comms.wire import tickets
from foundation.store.metadata_store import MetadataStore
from tests.comms.helpers import BUFFER_SCHEMA, buffer_steps
from tests.fakes.cloud import RUN, Cloud
from tests.fakes.settings import fast_comms

SHARDS = 2


class Shards:
    """``SHARDS`` buffers, each with its ingest endpoint on loopback (as the shard actors
    start them), and the cloud's routes to them."""

    def __init__(self, root: Path, key: bytes) -> None:
        self.key = key
        self.buffers = [
            ReplayBuffer.open(root / f"shard-{k}", BUFFER_SCHEMA) for k in range(SHARDS)
        ]
        start = ShardIngest(fast_comms(), RUN, key, host="127.0.0.1")
        self.servers = [start(b, k, root / f"shard-{k}") for k, b in enumerate(self.buffers)]
        self.routes = ShardRoutes(RUN, key, SHARDS, lambda: [s.address for s in self.servers])

    def close(self) -> None:
        for s in self.servers:
            s.stop()
        for b in self.buffers:
            b.close()


@pytest.fixture
def shards(tmp_path: Path) -> Iterator[Shards]:
    s = Shards(tmp_path / "buffer", tickets.new_key())
    yield s
    s.close()


def _open_stream(
    address: str, metadata: tuple[tuple[str, str], ...], robot: int
) -> grpc.RpcError | None:
    """Open an upload stream with ``metadata`` and send one batch of ``robot``; the
    refusal, if any."""
    channel = make_channel(address, fast_comms())
    batch = S.encode_batch(buffer_steps(robot, 0, 4))
    msgs = [pb.StepBatch(run_id=RUN), pb.StepBatch(run_id=RUN, last_seq=3, arrow_ipc=batch)]
    try:
        list(rpc.ExperienceStub(channel).Upload(iter(msgs), metadata=metadata, timeout=10))
    except grpc.RpcError as exc:
        return exc
    finally:
        channel.close()
    return None


def test_the_shard_refuses_tickets_by_name_and_stores_nothing(shards: Shards) -> None:
    robot = next(r for r in range(1, 50) if shard_of(r, SHARDS) == 0)
    now = time.time()

    def ticket(
        key: bytes = shards.key, shard: int = 0, exp: float = now + 60, run: str = RUN
    ) -> str:
        return tickets.issue(key, tickets.Ticket(run, robot, "arm", shard, exp))

    cases = {
        "missing shard ticket": (("robofleet-robot", str(robot)),),
        "wrong signature": tickets.ticket_metadata(ticket(key=tickets.new_key()), robot),
        "expired": tickets.ticket_metadata(ticket(exp=now - 5), robot),
        "is for shard 1; this is shard 0": tickets.ticket_metadata(ticket(shard=1), robot),
        "is for run 'run-other'": tickets.ticket_metadata(ticket(run="run-other"), robot),
        f"is for robot {robot}; the caller sent robot {robot + 1}": tickets.ticket_metadata(
            ticket(), robot + 1
        ),
        "malformed": tickets.ticket_metadata("not-a-ticket", robot),
    }
    address = shards.servers[0].address
    for expected, metadata in cases.items():
        err = _open_stream(address, metadata, robot)
        assert err is not None, expected
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED, (expected, err)  # type: ignore[attr-defined]
        assert expected in err.details(), (expected, err.details())  # type: ignore[attr-defined]
    assert shards.buffers[0].num_steps == 0
    assert shards.servers[0].figures()["rows"] == 0
    # The same batch with a valid ticket is stored: the refusals were the tickets'.
    assert _open_stream(address, tickets.ticket_metadata(ticket(), robot), robot) is None
    assert shards.buffers[0].num_steps == 4


def test_uploads_go_to_the_robots_shard_and_follow_it_to_a_new_port(
    shards: Shards, store: MetadataStore, tmp_path: Path
) -> None:
    cloud = Cloud(store, routes=lambda run: shards.routes if run == RUN else None)
    robot = cloud.robot("arm-1")
    home = shard_of(robot.robot_id, SHARDS)
    client = cloud.client(robot)
    spool = MemorySpool()
    router = ShardRouter(client, RUN, robot.robot_id)
    up = Uploader(client, RUN, spool, router)
    try:
        for i in range(5):
            spool.put(buffer_steps(robot.robot_id, i * 8, 8))
        assert up.wait_durable(39, 20), up.last_error
        assert router.route is not None and router.route.shard == home
        assert shards.servers[home].figures()["rows"] == 40
        assert cloud.server.uploaded_rows(RUN) == 0
        assert shards.buffers[home].num_steps == 40
        assert shards.buffers[1 - home].num_steps == 0

        # The shard's endpoint goes away and comes back on another port: the robot keeps
        # its steps, asks the cloud again and resends from the shard's durable seq.
        old = shards.servers[home]
        old.stop()
        for i in range(5, 10):
            spool.put(buffer_steps(robot.robot_id, i * 8, 8))
        time.sleep(0.5)
        with socket.socket() as taken:  # its old port is taken meanwhile
            taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            taken.bind(("127.0.0.1", old.port))
            taken.listen()
            sink = ReplayBufferSink(shards.buffers[home])
            new = ShardIngestServer(
                fast_comms(), sink, RUN, home, shards.key, "127.0.0.1", port=old.port
            )
            new.start()
        assert new.port != old.port
        shards.servers[home] = new
        assert up.wait_durable(79, 30), up.last_error
        assert router.asked >= 2
        assert cloud.server.uploaded_rows(RUN) == 0
    finally:
        up.close()
        client.close()
        cloud.close()
    buf = shards.buffers[home]
    # Each acknowledged step stored once.
    assert buf.num_steps == 80
    assert buf.stored_seqs(str(robot.robot_id)).tolist() == list(range(80))
