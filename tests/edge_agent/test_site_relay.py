"""The pieces of a robot computer behind a site relay (``edge_agent.site_relay``); the whole
path, with real relay and robot-computer processes, is ``tests/runs/test_site_relay_robots.py``."""

from __future__ import annotations

from typing import Any

import pytest

from edge_agent.site_relay import with_counters, zmq_address


def test_the_fan_out_address_is_the_relays_host_on_its_zmq_port() -> None:
    assert zmq_address("relay.room-1.lan:50061", 50062) == "tcp://relay.room-1.lan:50062"
    assert zmq_address("10.0.0.7:1", 2) == "tcp://10.0.0.7:2"
    assert zmq_address("[fd00::7]:50061", 50062) == "tcp://[fd00::7]:50062"
    for bad in ("relay", ":50061", "relay:port"):
        with pytest.raises(ValueError, match="edge.relay must be host:port"):
            zmq_address(bad, 50062)


def test_every_beat_carries_the_relay_counters_beside_the_agents() -> None:
    sent: list[tuple[Any, ...]] = []

    def beat(state: str, version: int | None, stats: Any, **kw: Any) -> float:
        sent.append((state, version, dict(stats), kw))
        return 1.0

    counters = {"relay_weight_bytes": 10.0}
    wrapped = with_counters(beat, lambda: dict(counters))
    assert wrapped("running", 3, {"steps": 5.0}, info={"help": []}) == 1.0
    counters["relay_weight_bytes"] = 20.0
    wrapped("running", 4, {"steps": 6.0})
    assert sent == [
        ("running", 3, {"steps": 5.0, "relay_weight_bytes": 10.0}, {"info": {"help": []}}),
        ("running", 4, {"steps": 6.0, "relay_weight_bytes": 20.0}, {}),
    ]


def test_a_relay_that_is_not_host_port_is_refused_at_start(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from pydantic import ValidationError

    from edge_agent.config import EdgeSettings
    from robofleet.commands import edge

    with pytest.raises(ValidationError, match="edge.relay must be host:port"):
        EdgeSettings(relay="relay.lan")
    assert EdgeSettings(relay="relay.lan:50061").relay == "relay.lan:50061"
    # The robot computer stops before it dials anything: exit code 2 and one line.
    assert edge.main(["--server", "127.0.0.1:9", "--robot", "arm-1", "--relay", "relay"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "robofleet edge: --relay: Value error, edge.relay must be host:port, got 'relay'"
    ]


@pytest.mark.parametrize("server", ["nonsense", "cloud.lan:", "[fd00::7]", "cloud.lan:port"])
def test_a_cloud_address_without_a_port_is_refused_at_start(
    server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Dialled as given, a bare host means gRPC's port 443, and the robot computer would wait
    # for that cloud forever, as it waits for one that is down.
    from robofleet.commands import edge

    assert edge.main(["--server", server, "--robot", "arm-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "robofleet edge: --server must be the cloud's gRPC host:port (e.g. cloud.lan:50051), "
        f"got {server!r}"
    ]


def test_cloud_addresses_that_name_a_port_or_a_grpc_scheme_pass() -> None:
    from robofleet.commands.edge import check_server

    for ok in ("cloud.lan:50051", "10.0.0.7:50051", "[fd00::7]:50051", "dns:///cloud:50051"):
        check_server(ok)
