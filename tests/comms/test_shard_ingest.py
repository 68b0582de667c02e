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
from comms.robot.shard_route import Route, ShardRouter
from comms.robot.uploader import MemorySpool, Uploader
from comms.wire import steps as S
from comms.wire import tickets
from foundation.store.metadata_store import MetadataStore
from tests.comms.helpers import BUFFER_SCHEMA, buffer_steps, self_signed_cert
from tests.fakes.cloud import RUN, Cloud
from tests.fakes.disk import Disk
from tests.fakes.procs import wait_until
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


def test_the_router_refreshes_a_ticket_before_it_expires_and_rides_out_a_cloud_outage(
    shards: Shards, store: MetadataStore
) -> None:
    cloud = Cloud(store, routes=lambda run: shards.routes if run == RUN else None)
    robot = cloud.robot("arm-1")
    client = cloud.client(robot)
    now = time.time()
    # The assignment's route: issued 70 s of its 90 s ago, so less than a third is left.
    shards.routes.ttl_s = 90
    first = shards.routes.route(robot.robot_id, "arm-1", now=now - 70)
    router = ShardRouter(client, RUN, robot.robot_id, Route.from_proto(first))
    try:
        router.target()
        assert router.asked == 1  # refreshed before its expiry
        assert router.route is not None and router.route.expires_at > first.expires_at
        router.target()
        assert router.asked == 1  # a fresh route is used as it is

        # The cloud is away: after a stream to the shard ended, the valid route is kept...
        cloud.stop()
        router.stream_ended(grpc.StatusCode.UNAVAILABLE)
        _, metadata, to_shard = router.target()
        assert to_shard and metadata[0][1] == "Bearer " + router.route.ticket
        # ...but a ticket the shard refused is not used again.
        router.stream_ended(grpc.StatusCode.UNAUTHENTICATED)
        with pytest.raises(grpc.RpcError):
            router.target()
    finally:
        router.close()
        client.close()
        cloud.close()


def test_an_unsharded_runs_route_is_the_cloud(store: MetadataStore) -> None:
    cloud = Cloud(store)
    robot = cloud.robot("arm-1")
    client = cloud.client(robot)
    router = ShardRouter(client, RUN, robot.robot_id)
    try:
        upload, metadata, to_shard = router.target()
        assert not to_shard and upload is client.upload_stream and metadata == client.metadata
    finally:
        router.close()
        client.close()
        cloud.close()


def test_a_plaintext_endpoint_beyond_loopback_is_refused_without_insecure_network(
    tmp_path: Path,
) -> None:
    from comms.cloud.shard_ingest import InsecureEndpoint

    with ReplayBuffer.open(tmp_path / "shard-0", BUFFER_SCHEMA) as buf:
        sink = ReplayBufferSink(buf)
        server = ShardIngestServer(fast_comms(), sink, RUN, 0, tickets.new_key(), "0.0.0.0")
        with pytest.raises(InsecureEndpoint, match="insecure_network"):
            server.start()


def test_the_endpoint_serves_tls_with_the_clouds_certificate(tmp_path: Path) -> None:
    from comms.robot.client import EdgeClient

    cert, key_file = self_signed_cert(tmp_path)
    server_settings = fast_comms().model_copy(
        update={"tls_cert_file": cert, "tls_key_file": key_file}
    )
    robot_settings = fast_comms().model_copy(update={"tls_ca_file": cert})
    key = tickets.new_key()
    robot = next(r for r in range(1, 50) if shard_of(r, SHARDS) == 1)
    with ReplayBuffer.open(tmp_path / "buffer" / "shard-1", BUFFER_SCHEMA) as buf:
        server = ShardIngest(server_settings, RUN, key, host="127.0.0.1")(
            buf, 1, tmp_path / "buffer" / "shard-1"
        )
        routes = ShardRoutes(RUN, key, SHARDS, lambda: ["", server.address], tls=True)
        # Nothing listens where the robot's cloud would be: the route comes with the
        # assignment and is fresh, so the cloud is not asked.
        client = EdgeClient(make_channel("127.0.0.1:9", robot_settings), "unused", robot_settings)
        router = ShardRouter(client, RUN, robot, Route.from_proto(routes.route(robot, "arm")))
        spool = MemorySpool()
        up = Uploader(client, RUN, spool, router)
        try:
            spool.put(buffer_steps(robot, 0, 8))
            assert up.wait_durable(7, 20), up.last_error
            assert server.figures()["tls"] and server.figures()["rows"] == 8
            assert router.asked == 0
        finally:
            up.close()
            client.close()
            server.stop()
        assert buf.stored_seqs(str(robot)).tolist() == list(range(8))


def test_a_full_shard_disk_is_refused_by_name_and_reported_as_the_runs_events(
    full_disk: Disk, store: MetadataStore
) -> None:
    key = tickets.new_key()
    cloud = Cloud(store, settings=fast_comms(reconnect_max_s=1.0))
    robot = cloud.robot("arm-1")
    home = shard_of(robot.robot_id, SHARDS)
    directory = full_disk.path / f"shard-{home}"
    buf = ReplayBuffer.open(directory, BUFFER_SCHEMA)
    server = ShardIngest(fast_comms(), RUN, key, host="127.0.0.1")(buf, home, directory)
    addresses = ["", ""]
    addresses[home] = server.address
    cloud.server.state.routes = lambda run: ShardRoutes(RUN, key, SHARDS, lambda: addresses)
    client = cloud.client(robot)
    spool = MemorySpool()
    up = Uploader(client, RUN, spool, ShardRouter(client, RUN, robot.robot_id))
    n = 0
    try:
        spool.put(buffer_steps(robot.robot_id, n, 8))
        n += 8
        assert up.wait_durable(n - 1, 20), up.last_error
        full_disk.fill()
        for _ in range(40):  # more than the last pages of the disk hold
            spool.put(buffer_steps(robot.robot_id, n, 8))
            n += 8
        wait_until(
            lambda: "buffer disk full" in (up.last_error or ""), 20, lambda: str(up.last_error)
        )
        assert "RESOURCE_EXHAUSTED" in str(up.last_error)
        wait_until(lambda: server.figures()["events"], 10, lambda: "no endpoint event")
        [full] = server.figures()["events"]
        assert full["kind"] == "buffer.disk_full" and full["data"]["shard"] == home
        full_disk.free()
        assert up.wait_durable(n - 1, 30), up.last_error
        kinds = [e["kind"] for e in server.figures()["events"]]
        assert kinds == ["buffer.disk_full", "buffer.disk_recovered"]
        assert buf.stored_seqs(str(robot.robot_id)).tolist() == list(range(n))
    finally:
        full_disk.free()
        up.close()
        client.close()
        server.stop()
        cloud.close()
        buf.close()
