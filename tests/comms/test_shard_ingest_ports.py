"""A shard's ingest endpoint inside a fixed port range (``comms.shard_ingest_port``), as a
firewall or a hostNetwork pod needs: each endpoint takes two ports of it (gRPC and the ZeroMQ
data plane), shards of one node take successive free ones, a restarted shard takes its own
ports again, a full range refuses by name instead of binding a port outside it, and a range
too small for what a node hosts is refused at the run's start."""

from __future__ import annotations

import copy
import socket
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from pydantic import ValidationError

from buffer import ReplayBuffer
from comms.cloud.shard_ingest import ShardIngest, ShardIngestServer, ports_to_try
from comms.cloud.shard_ports import PortRangeFull, PortRangeTooSmall, check_range
from comms.cloud.shard_routes import ShardRoutes
from comms.config import CommsSettings
from comms.robot.shard_route import ShardRouter
from comms.robot.uploader import MemorySpool, Uploader
from comms.wire import tickets
from foundation.store.metadata_store import MetadataStore
from tests.comms.helpers import BUFFER_SCHEMA, buffer_steps
from tests.fakes.cloud import RUN, Cloud
from tests.fakes.settings import fast_comms

RANGE_FULL = r"{first}-{last} \(comms.shard_ingest_port, shard_ingest_ports\) is full"


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


def _hold(stack: ExitStack, port: int) -> None:
    """Keep ``port`` on loopback taken (listening) until ``stack`` closes."""
    sock = stack.enter_context(socket.socket())
    sock.bind(("127.0.0.1", port))
    sock.listen()


@pytest.fixture
def buffers(tmp_path: Path) -> Iterator[list[ReplayBuffer]]:
    bufs = [ReplayBuffer.open(tmp_path / f"shard-{k}", BUFFER_SCHEMA) for k in range(3)]
    yield bufs
    for b in bufs:
        b.close()


def test_ports_to_try_keeps_the_old_port_and_stays_inside_the_range() -> None:
    assert ports_to_try(fast_comms(), 0) == [0]
    assert ports_to_try(fast_comms(), 41000) == [41000, 0]
    assert ports_to_try(fast_comms(), 41000, avoid=41001) == [41000, 0]
    ranged = fast_comms(shard_ingest_port=41000, shard_ingest_ports=4)
    assert ports_to_try(ranged, 0) == [41000, 41001, 41002, 41003]
    assert ports_to_try(ranged, 41002) == [41002, 41000, 41001, 41003]
    assert ports_to_try(ranged, 50000) == [41000, 41001, 41002, 41003]  # outside: not tried
    # The other socket's kept port is tried last, so a restart does not take it.
    assert ports_to_try(ranged, 41002, avoid=41000) == [41002, 41001, 41003, 41000]
    top = fast_comms(shard_ingest_port=65534, shard_ingest_ports=8)
    assert ports_to_try(top, 0) == [65534, 65535]


def test_a_range_too_small_for_a_node_is_refused_by_name() -> None:
    # One shard takes two ports with the data plane: a one-port range holds none.
    with pytest.raises(ValidationError, match="holds 1 port, and one shard takes two"):
        fast_comms(shard_ingest_port=41000, shard_ingest_ports=1)
    with pytest.raises(ValidationError, match="shard_ingest_ports 8 holds 1 port"):
        fast_comms(shard_ingest_port=65535, shard_ingest_ports=8)
    fast_comms(shard_ingest_port=41000, shard_ingest_ports=1, data_plane=False)
    fast_comms(shard_ingest_ports=1)  # no range: nothing to hold
    # A node that may host 6 shards needs 12 ports with the data plane, 6 without.
    ranged = fast_comms(shard_ingest_port=41000, shard_ingest_ports=11)
    with pytest.raises(PortRangeTooSmall, match=r"41000-41010 .* holds 11 ports.* 12 ports"):
        check_range(ranged, 6)
    check_range(ranged, 5)
    check_range(ranged.model_copy(update={"data_plane": False}), 6)
    check_range(fast_comms(), 1000)  # no range: any free ports


def test_both_ports_of_each_shard_lie_in_the_range_and_a_restart_takes_them_again(
    tmp_path: Path, buffers: list[ReplayBuffer]
) -> None:
    first = _free_block(4)
    settings = fast_comms(shard_ingest_port=first, shard_ingest_ports=4)
    start = ShardIngest(settings, RUN, tickets.new_key(), host="127.0.0.1")
    servers: list[ShardIngestServer] = []
    try:
        servers = [start(buffers[k], k, tmp_path / f"shard-{k}") for k in range(2)]
        taken = sorted(p for s in servers for p in (s.port, s.data_port))
        assert taken == list(range(first, first + 4))
        for k, s in enumerate(servers):
            assert s.state.dataplane is not None
            assert s.state.dataplane.endpoint == f"tcp://127.0.0.1:{s.data_port}"
            # Each shard keeps the ports it took, for the next start.
            assert (tmp_path / f"shard-{k}" / "ingest_port").read_text() == str(s.port)
            assert (tmp_path / f"shard-{k}" / "ingest_data_port").read_text() == str(s.data_port)
        # A third shard finds the range full and does not start.
        with pytest.raises(PortRangeFull, match=RANGE_FULL.format(first=first, last=first + 3)):
            start(buffers[2], 2, tmp_path / "shard-2")
        assert not (tmp_path / "shard-2" / "ingest_port").exists()
        assert not (tmp_path / "shard-2" / "ingest_data_port").exists()
        # A restarted shard binds its own two ports again.
        kept = servers[0].port, servers[0].data_port
        servers[0].stop()
        servers[0] = start(buffers[0], 0, tmp_path / "shard-0")
        assert (servers[0].port, servers[0].data_port) == kept
    finally:
        for s in servers:
            s.stop()


def test_a_restart_whose_data_port_is_taken_keeps_its_grpc_port(
    tmp_path: Path, buffers: list[ReplayBuffer]
) -> None:
    first = _free_block(3)
    settings = fast_comms(shard_ingest_port=first, shard_ingest_ports=3)
    start = ShardIngest(settings, RUN, tickets.new_key(), host="127.0.0.1")
    server = start(buffers[0], 0, tmp_path / "shard-0")
    kept = server.port, server.data_port
    server.stop()
    with ExitStack() as stack:
        _hold(stack, kept[1])  # another process took its data port meanwhile
        server = start(buffers[0], 0, tmp_path / "shard-0")
    try:
        # The data plane moves to the range's free port, not to the shard's own gRPC port.
        assert server.port == kept[0]
        assert server.data_port in range(first, first + 3)
        assert server.data_port not in kept
        saved = (tmp_path / "shard-0" / "ingest_data_port").read_text()
        assert saved == str(server.data_port)
    finally:
        server.stop()


@pytest.mark.parametrize("held", [1, 2])
def test_a_range_with_no_free_port_refuses_by_name_and_lets_go_of_what_it_took(
    tmp_path: Path, buffers: list[ReplayBuffer], held: int
) -> None:
    """``held`` of the range's two ports taken by others: with one, the data plane binds the
    other and gRPC finds none; with two, the data plane finds none."""
    first = _free_block(2)
    settings = fast_comms(shard_ingest_port=first, shard_ingest_ports=2)
    start = ShardIngest(settings, RUN, tickets.new_key(), host="127.0.0.1")
    with ExitStack() as stack:
        for p in range(first, first + held):
            _hold(stack, p)
        with pytest.raises(
            PortRangeFull, match=RANGE_FULL.format(first=first, last=first + 1)
        ) as e:
            start(buffers[0], 0, tmp_path / "shard-0")
    # It crosses Ray pickled: rebuilt from its reduction (what copy and pickle both use).
    assert str(copy.copy(e.value)) == str(e.value)
    # Nothing of the refused endpoint holds a port of the range.
    for p in (first, first + 1):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", p))


def _one_robot_uploads(
    settings: CommsSettings, buffer: ReplayBuffer, directory: Path, store: MetadataStore
) -> tuple[int, int, str, str]:
    """Shard 0 of ``RUN`` on 127.0.0.1 under ``settings``, and one robot that asks the cloud
    for its route and uploads 32 steps there over the data plane: the server's gRPC and data
    ports, the address the robot's route named and the data plane's offered endpoint."""
    key = tickets.new_key()
    server = ShardIngest(settings, RUN, key, host="127.0.0.1")(buffer, 0, directory)
    routes = ShardRoutes(RUN, key, 1, lambda: [server.address])
    cloud = Cloud(store, routes=lambda run: routes if run == RUN else None)
    robot = cloud.robot("arm-1")
    client = cloud.client(robot)
    spool = MemorySpool()
    router = ShardRouter(client, RUN, robot.robot_id)
    up = Uploader(client, RUN, spool, router)
    try:
        for i in range(4):
            spool.put(buffer_steps(robot.robot_id, i * 8, 8))
        assert up.wait_durable(31, 20), up.last_error
        assert server.figures()["rows"] == 32
        assert server.figures()["data_plane_batches"] > 0
        assert router.route is not None and server.state.dataplane is not None
        endpoint = server.state.dataplane.endpoint
        return server.port, server.data_port, router.route.address, endpoint
    finally:
        up.close()
        client.close()
        cloud.close()
        server.stop()


def test_a_robot_uploads_over_the_data_plane_inside_the_range(
    tmp_path: Path, buffers: list[ReplayBuffer], store: MetadataStore
) -> None:
    first = _free_block(2)
    settings = fast_comms(shard_ingest_port=first, shard_ingest_ports=2)
    port, data_port, _, _ = _one_robot_uploads(settings, buffers[0], tmp_path / "shard-0", store)
    assert {port, data_port} == {first, first + 1}


def test_a_node_behind_nat_is_advertised_at_its_outside_address(
    tmp_path: Path, buffers: list[ReplayBuffer], store: MetadataStore
) -> None:
    # The shard binds the node's IP (127.0.0.1 here) and tells robots the address they reach
    # the node at ("localhost": a name, as a NAT's outside address would be): for gRPC and for
    # its data plane, which the robot used.
    settings = fast_comms(shard_advertise_hosts={"127.0.0.1": "localhost"})
    port, data_port, routed, endpoint = _one_robot_uploads(
        settings, buffers[0], tmp_path / "shard-0", store
    )
    assert routed == f"localhost:{port}"
    assert endpoint == f"tcp://localhost:{data_port}"
