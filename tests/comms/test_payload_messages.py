"""Hand-assembled messages (comms.wire.payload_messages) parse as the protobuf messages they claim to be."""

from __future__ import annotations

import os

import pytest

from comms.proto import robofleet_pb2 as pb
from comms.wire import payload_messages


@pytest.mark.parametrize("size", [0, 1, 127, 128, 300, 1024 * 1024])
def test_weight_chunk_parses_as_the_protobuf_message(size: int) -> None:
    data = os.urandom(size)
    raw = payload_messages.weight_chunk(7, -1, 3, memoryview(data))
    expected = pb.WeightMessage(chunk=pb.Chunk(version=7, base_version=-1, index=3, data=data))
    assert pb.WeightMessage.FromString(raw) == expected


@pytest.mark.parametrize("more", [False, True])
def test_step_batch_parses_as_the_protobuf_message(more: bool) -> None:
    data = os.urandom(70_000)
    raw = payload_messages.step_batch("run-1", 41, memoryview(data)[10:], more)
    assert pb.StepBatch.FromString(raw) == pb.StepBatch(
        run_id="run-1", last_seq=41, arrow_ipc=data[10:], more=more
    )


def test_varint_matches_protobuf() -> None:
    for n in (0, 1, 127, 128, 16383, 16384, 2**32, 2**63 - 1):
        # Field 1 of Chunk is an int64: tag byte 0x08 then the varint.
        assert pb.Chunk(version=n).SerializeToString() == (
            b"\x08" + payload_messages.varint(n) if n else b""
        )


def test_passthrough_sends_bytes_as_they_are_and_serializes_messages() -> None:
    assert payload_messages.passthrough(b"abc") == b"abc"
    m = pb.UploadAck(durable_seq=5)
    assert payload_messages.passthrough(m) == m.SerializeToString()
