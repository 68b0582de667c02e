"""A cloud bound to every interface (``comms.bind_host: 0.0.0.0``) with no
``comms.data_advertise_host`` offers its data plane at a wildcard host: robots dial it at the
host they dial for gRPC, and a robot that does not know that host declines the offer at once
(gRPC bytes, no handshake waited out). The cloud says so at start, and names a random data
port as one no firewall or Service can open."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import zmq

from comms.cloud.step_sink import MemorySink
from comms.proto import robofleet_pb2 as pb
from comms.robot import dataplane_client
from comms.robot.client import EdgeClient, make_channel
from comms.robot.dataplane_client import grpc_host, reachable_endpoint
from comms.robot.grpc_subscription import GrpcWeightSubscription
from comms.robot.receiver import WeightReceiver
from comms.robot.uploader import MemorySpool, Uploader
from foundation.store.metadata_store import MetadataStore
from tests.comms.helpers import steps
from tests.fakes.cloud import RUN, Cloud, Robot, free_port
from tests.fakes.settings import fast_comms

HANDSHAKE_S = 5.0  # long enough that a handshake waited out shows in the time to first ack


@pytest.fixture
def wildcard_cloud(store: MetadataStore) -> Iterator[Cloud[MemorySink]]:
    """A cloud on 0.0.0.0 (reachable here at 127.0.0.1), data plane on a fixed port, no
    advertise host."""
    settings = fast_comms(
        bind_host="0.0.0.0", data_port=free_port(), data_plane_handshake_s=HANDSHAKE_S
    )
    with Cloud(store, MemorySink(), settings) as cloud:
        yield cloud


def _client(cloud: Cloud[Any], robot: Robot, *, knows_address: bool) -> EdgeClient:
    """A robot's client dialing the cloud at 127.0.0.1 (not at the wildcard it binds)."""
    address = f"127.0.0.1:{cloud.port}"
    channel = make_channel(address, cloud.settings)
    return EdgeClient(
        channel, robot.credential, cloud.settings, address=address if knows_address else None
    )


def _record_dialed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The endpoints the robot's data-plane sockets connected to (answered or not)."""
    dialed: list[str] = []
    real = dataplane_client.connect

    def spy(offer: pb.DataPlane, handshake_s: float, **kw: Any) -> zmq.Socket[bytes] | None:
        sock = real(offer, handshake_s, **kw)
        if sock is not None:
            dialed.append(sock.getsockopt_string(zmq.LAST_ENDPOINT))
        return sock

    monkeypatch.setattr(dataplane_client, "connect", spy)
    return dialed


def test_a_wildcard_offer_is_dialed_at_the_host_the_robot_dials_for_grpc(
    wildcard_cloud: Cloud[MemorySink], monkeypatch: pytest.MonkeyPatch
) -> None:
    cloud = wildcard_cloud
    dp_port = cloud.settings.data_port
    assert cloud.server.data_endpoint == f"tcp://0.0.0.0:{dp_port}"
    dialed = _record_dialed(monkeypatch)
    robot = cloud.robot("arm-1")
    client = _client(cloud, robot, knows_address=True)
    rx = WeightReceiver()
    src = GrpcWeightSubscription(client, RUN, rx)
    spool = MemorySpool()
    up = Uploader(client, RUN, spool)
    try:
        state = {"w": np.arange(300_000, dtype=np.float32)}
        cloud.server.distributor(RUN).publish(state)
        for i in range(6):
            spool.put(steps(robot.robot_id, i * 5, 5))
        assert up.wait_durable(29, 20), up.last_error
        assert cloud.sink.seqs(robot.robot_id) == list(range(30))
        assert up.data_plane_batches == 6
        assert rx.wait_for(0, 20)
        np.testing.assert_array_equal(rx.current()[1]["w"], state["w"])
        assert src.data_plane_bytes > 0
        assert dialed == [f"tcp://127.0.0.1:{dp_port}"] * 2
    finally:
        up.close()
        src.close()
        client.close()


def test_a_robot_that_does_not_know_its_grpc_host_declines_a_wildcard_offer_at_once(
    wildcard_cloud: Cloud[MemorySink],
) -> None:
    cloud = wildcard_cloud
    robot = cloud.robot("arm-1")
    client = _client(cloud, robot, knows_address=False)
    spool = MemorySpool()
    up = Uploader(client, RUN, spool)
    try:
        t0 = time.monotonic()
        spool.put(steps(robot.robot_id, 0, 5))
        assert up.wait_durable(4, 20), up.last_error
        assert time.monotonic() - t0 < HANDSHAKE_S / 2  # no handshake waited out
        assert up.data_plane_batches == 0
        assert cloud.sink.seqs(robot.robot_id) == list(range(5))
    finally:
        up.close()
        client.close()


def test_the_cloud_says_at_start_how_a_wildcard_or_random_data_plane_is_reached(
    store: MetadataStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="comms.cloud.server")
    with Cloud(store, MemorySink(), fast_comms(bind_host="0.0.0.0", data_port=0)) as cloud:
        port = cloud.server.state.dataplane.port  # type: ignore[union-attr]
    text = caplog.text
    assert "comms.data_advertise_host" in text and f"tcp://0.0.0.0:{port}" in text
    assert "comms.data_port is 0" in text
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and f"took port {port}" in warned[0].getMessage()

    caplog.clear()
    settings = fast_comms(
        bind_host="0.0.0.0", data_port=free_port(), data_advertise_host="127.0.0.1"
    )
    with Cloud(store, MemorySink(), settings) as cloud:
        assert cloud.server.data_endpoint == f"tcp://127.0.0.1:{settings.data_port}"
    assert "comms.data_advertise_host" not in caplog.text
    assert "comms.data_port" not in caplog.text


@pytest.mark.parametrize(
    ("endpoint", "dialed", "want"),
    [
        ("tcp://0.0.0.0:50052", "cloud.example.org:50051", "tcp://cloud.example.org:50052"),
        ("tcp://0.0.0.0:50052", "dns:///cloud.example.org:50051", "tcp://cloud.example.org:50052"),
        ("tcp://0.0.0.0:50052", "ipv4:10.0.0.7:50051", "tcp://10.0.0.7:50052"),
        ("tcp://0.0.0.0:50052", "[fd00::7]:50051", "tcp://[fd00::7]:50052"),
        ("tcp://[::]:50052", "cloud:50051", "tcp://cloud:50052"),
        ("tcp://*:50052", "cloud", "tcp://cloud:50052"),
        ("tcp://0.0.0.0:50052", None, None),
        ("tcp://0.0.0.0:50052", "unix:/run/robofleet.sock", None),
        ("tcp://0.0.0.0:50052", "fd00::7", None),
        ("tcp://10.0.0.3:50100", "cloud.example.org:50051", "tcp://10.0.0.3:50100"),
        ("tcp://10.0.0.3:50100", None, "tcp://10.0.0.3:50100"),
    ],
)
def test_only_a_wildcard_host_is_replaced_by_the_dialed_one(
    endpoint: str, dialed: str | None, want: str | None
) -> None:
    assert reachable_endpoint(endpoint, dialed) == want


def test_grpc_host_names_the_host_of_a_target() -> None:
    assert grpc_host("127.0.0.1:50051") == "127.0.0.1"
    assert grpc_host("[::1]:50051") == "[::1]"
    assert grpc_host("ipv4:1.2.3.4:5,5.6.7.8:5") is None
    assert grpc_host("") is None
