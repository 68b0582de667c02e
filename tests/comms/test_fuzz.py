"""Every method of the cloud server, fed what no client should send: random bytes, empty
messages, a frame over the message limit and (on request streams) garbage after a good
opening. Each gets a named refusal (INVALID_ARGUMENT naming the message or the empty field,
RESOURCE_EXHAUSTED for the oversize frame), nothing is logged at ERROR, and the server still
serves a good robot afterwards.

The methods are enumerated from the service descriptors, so a method added to the proto is
fuzzed too (and fails here until its expectations below are written down).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import DecodeError
from google.protobuf.message_factory import GetMessageClass

from comms.proto import robofleet_pb2 as pb
from comms.robot.uploader import MemorySpool, Uploader
from comms.wire.credentials import credential_metadata
from foundation.store.models import Robot
from tests.comms.helpers import rpc_code, steps
from tests.fakes.cloud import RUN, Cloud

METHODS: list[MethodDescriptor] = [
    m for service in pb.DESCRIPTOR.services_by_name.values() for m in service.methods
]

# Method -> what its empty request is refused with (None: an empty request is a valid one).
EMPTY_REFUSAL: dict[str, str | None] = {
    "Enroll": "EnrollRequest.token is empty",
    "Upload": "StepBatch.run_id is empty",
    "Route": "RouteRequest.run_id is empty",
    "Subscribe": "SubscribeRequest.run_id is empty",
    "Fetch": "FetchRequest.run_id is empty",
    "Beat": "HeartbeatRequest.state is empty",
    "Commands": None,
    "Act": "ActRequest.run_id is empty",
    "Mark": "EpisodeMark.run_id is empty",
    "Report": None,
}
# Request-streaming method -> good opening messages (garbage is sent after each).
OPENINGS: dict[str, list[Any]] = {
    "Upload": [pb.StepBatch(run_id=RUN), pb.StepBatch(run_id=RUN, data_plane=True)],
    "Subscribe": [
        pb.SubscribeRequest(run_id=RUN, have_version=-1),
        pb.SubscribeRequest(run_id=RUN, have_version=-1, data_plane=True),
    ],
}
OVERSIZE = 9 * 1024 * 1024  # over the server's 8 MiB receive limit


def _path(m: MethodDescriptor) -> str:
    return f"/{m.containing_service.full_name}/{m.name}"


def _call(
    channel: grpc.Channel, m: MethodDescriptor, messages: list[bytes], metadata: Any
) -> grpc.RpcError | None:
    """Call ``m`` with raw request bytes (identity serializers); its error, or None."""
    kind = {
        (False, False): channel.unary_unary,
        (False, True): channel.unary_stream,
        (True, False): channel.stream_unary,
        (True, True): channel.stream_stream,
    }[(m.client_streaming, m.server_streaming)]
    multi = kind(_path(m), request_serializer=None, response_deserializer=None)
    request: Any = iter(messages) if m.client_streaming else messages[0]
    try:
        reply = multi(request, metadata=metadata, timeout=5)
        if m.server_streaming:
            list(reply)
    except grpc.RpcError as exc:
        return exc
    return None


def _garbage(m: MethodDescriptor, rng: np.random.Generator) -> bytes:
    """4 KB of random bytes that do not decode as the method's request."""
    cls = GetMessageClass(m.input_type)
    while True:
        data = rng.integers(0, 256, 4096, dtype=np.uint8).tobytes()
        try:
            cls.FromString(data)
        except DecodeError:
            return data


def _invalid(err: grpc.RpcError | None, *needles: str) -> None:
    assert err is not None, "the call was accepted"
    details = err.details() or ""  # type: ignore[attr-defined]
    assert rpc_code(err) == grpc.StatusCode.INVALID_ARGUMENT, (rpc_code(err), details)
    for needle in needles:
        assert needle in details, details


@pytest.fixture
def raw_channel(cloud: Cloud) -> Iterator[grpc.Channel]:
    # No client-side limits, so the oversize frame reaches the server.
    ch = grpc.insecure_channel(
        cloud.address,
        options=[("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)],
    )
    yield ch
    ch.close()


def test_every_method_is_covered() -> None:
    assert sorted(EMPTY_REFUSAL) == sorted(m.name for m in METHODS)
    streaming = sorted(m.name for m in METHODS if m.client_streaming)
    assert sorted(OPENINGS) == streaming


@pytest.mark.parametrize("m", METHODS, ids=lambda m: m.name)
def test_garbage_empty_and_oversize_get_named_refusals(
    cloud: Cloud, raw_channel: grpc.Channel, caplog: pytest.LogCaptureFixture, m: MethodDescriptor
) -> None:
    robot = cloud.robot("arm-1")
    md = credential_metadata(robot.credential)
    rng = np.random.default_rng(16)
    with caplog.at_level(logging.WARNING):
        _invalid(_call(raw_channel, m, [_garbage(m, rng)], md), m.input_type.name, "undecodable")
        for opening in OPENINGS.get(m.name, []):
            err = _call(raw_channel, m, [opening.SerializeToString(), _garbage(m, rng)], md)
            _invalid(err, m.input_type.name, "undecodable")
        want = EMPTY_REFUSAL[m.name]
        if want is not None:
            _invalid(_call(raw_channel, m, [b""], md), want)
        err = _call(raw_channel, m, [b"\0" * OVERSIZE], md)
        assert err is not None and rpc_code(err) == grpc.StatusCode.RESOURCE_EXHAUSTED
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not errors, [r.getMessage() for r in errors]
    _serves_a_good_robot(cloud, robot)


def _serves_a_good_robot(cloud: Cloud, robot: Any) -> None:
    client = cloud.client(robot)
    try:
        with cloud.store.session() as s:
            row = s.get(Robot, robot.robot_id)
            assert row is not None and (row.stats or {}).get("state", "none") != ""
        assert client.heartbeat("running", None, {}) > 0
        spool = MemorySpool()
        up = Uploader(client, RUN, spool)
        try:
            spool.put(steps(robot.robot_id, 0, 5))
            assert up.wait_durable(4, 10)
        finally:
            up.close()
        assert cloud.sink.seqs(robot.robot_id) == [0, 1, 2, 3, 4]
    finally:
        client.close()
