"""Serialized protobuf messages built around a large bytes field with one copy.

Building ``pb.WeightMessage(chunk=pb.Chunk(data=...))`` and serializing it copies the data
twice, holding the GIL. A protobuf message is the concatenation of its
encoded fields (https://protobuf.dev/programming-guides/encoding/), so the small fields are
serialized by protobuf and the payload is appended behind its tag and length: one ``join``.
The results parse as ordinary messages (``tests/comms/test_payload_messages.py`` proves it).

gRPC methods that send these bytes use :func:`passthrough` as their serializer, which accepts
either such bytes or a message.
"""

from __future__ import annotations

from typing import Any

from comms.proto import robofleet_pb2 as pb

# (field number << 3) | wire type 2 (length-delimited)
_WEIGHT_MESSAGE_CHUNK = (2 << 3) | 2
_CHUNK_DATA = (4 << 3) | 2
_STEP_BATCH_ARROW = (3 << 3) | 2

Buffer = bytes | bytearray | memoryview


def varint(n: int) -> bytes:
    """Protobuf base-128 varint of a non-negative integer."""
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def weight_chunk(version: int, base_version: int, index: int, data: Buffer) -> bytes:
    """The serialized ``pb.WeightMessage(chunk=pb.Chunk(...))`` holding ``data``."""
    head = pb.Chunk(version=version, base_version=base_version, index=index).SerializeToString()
    inner = len(head) + 1 + len(varint(len(data))) + len(data)
    return b"".join(
        (
            bytes((_WEIGHT_MESSAGE_CHUNK,)),
            varint(inner),
            head,
            bytes((_CHUNK_DATA,)),
            varint(len(data)),
            data,
        )
    )


def step_batch(run_id: str, last_seq: int, data: Buffer, more: bool) -> bytes:
    """The serialized ``pb.StepBatch`` carrying ``data`` as ``arrow_ipc``."""
    head = pb.StepBatch(run_id=run_id, last_seq=last_seq, more=more).SerializeToString()
    return b"".join((head, bytes((_STEP_BATCH_ARROW,)), varint(len(data)), data))


def passthrough(msg: Any) -> bytes:
    """gRPC serializer: bytes built here go out as they are, messages are serialized."""
    if isinstance(msg, bytes):
        return msg
    return bytes(msg.SerializeToString())
