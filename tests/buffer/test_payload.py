"""A batch reply's payload (``buffer.service.payload``): the safetensors layout split into
frames at tensor boundaries, sent without copying the tensors and read in place, writable."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zmq
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from buffer.service.payload import INLINE_BYTES, PayloadError, arrays_in_place, tensor_frames


def _tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "observation.images.front": rng.integers(0, 256, (64, 32, 32, 3), dtype=np.uint8),
        "next.observation.images.front": rng.integers(0, 256, (64, 32, 32, 3), dtype=np.uint8),
        "observation.state": rng.standard_normal((64, 5), dtype=np.float32),
        "timestamp": rng.random(64),
        "episode_index": np.arange(64, dtype=np.int64),
        "shard": np.arange(64, dtype=np.int16),
        "terminated": rng.random(64) < 0.5,
        "half": np.ones((2, 3), dtype=np.float16),
        "none": np.zeros((0, 7), dtype=np.float32),
        "strided": np.arange(20, dtype=np.int32)[::2],
        "big_endian": np.arange(4, dtype=">f8"),
    }


def _over_zmq(frames: list[bytes | np.ndarray]) -> list[zmq.Frame]:
    ctx = zmq.Context.instance()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        port = a.bind_to_random_port("tcp://127.0.0.1")
        b.connect(f"tcp://127.0.0.1:{port}")
        a.send_multipart(frames, copy=False)
        return list(b.recv_multipart(copy=False))
    finally:
        a.close(0)
        b.close(0)


def test_frames_are_the_safetensors_layout_and_read_back_in_place() -> None:
    sent = _tensors()
    frames = tensor_frames(sent)
    # The header and the small tensors in the first frame; each camera's frames its own.
    assert len(frames) == 3
    assert all(isinstance(f, np.ndarray) and f.nbytes >= INLINE_BYTES for f in frames[1:])
    assert frames[1] is sent["observation.images.front"]  # not copied
    # Joined, the frames are a safetensors payload.
    joined = st_load(b"".join(f if isinstance(f, bytes) else f.tobytes() for f in frames))
    got = arrays_in_place([f.buffer for f in _over_zmq(frames)])
    assert sorted(got) == sorted(joined) == sorted(sent)
    for k, v in sent.items():
        assert got[k].shape == v.shape and got[k].dtype == v.dtype.newbyteorder("<")
        np.testing.assert_array_equal(got[k], v)
        np.testing.assert_array_equal(joined[k], v)
        assert got[k].flags.writeable
        assert got[k].ctypes.data % got[k].dtype.itemsize == 0  # aligned to its item size


def test_arrays_are_the_received_frames_memory() -> None:
    received = _over_zmq(tensor_frames(_tensors()))
    got = arrays_in_place([f.buffer for f in received])
    cam = got["observation.images.front"]
    cam[0, 0, 0, 0] = 7
    assert (
        arrays_in_place([f.buffer for f in received])["observation.images.front"][0, 0, 0, 0] == 7
    )
    del received, got
    assert cam[0, 0, 0, 0] == 7  # the array keeps its frame's memory alive


def test_one_buffer_holding_the_whole_layout_is_a_payload() -> None:
    payload = st_save({"x": np.arange(3, dtype=np.int32)}, metadata={"who": "test"})
    got = arrays_in_place([memoryview(bytearray(payload))])
    assert list(got) == ["x"] and got["x"].tolist() == [0, 1, 2]


def test_a_dtype_without_a_safetensors_name_is_refused() -> None:
    with pytest.raises(PayloadError, match="no safetensors dtype"):
        tensor_frames({"task": np.array(["reach"], dtype=object)})


def _with_header(header: object, data: bytes = b"") -> memoryview:
    raw = json.dumps(header).encode()
    return memoryview(bytearray(len(raw).to_bytes(8, "little") + raw + data))


F32 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        ([], "without frames"),
        ([memoryview(bytearray(b"\x01\x00"))], "no header length"),
        ([memoryview(bytearray((100).to_bytes(8, "little") + b"{}"))], "past the first frame"),
        ([memoryview(bytearray((2).to_bytes(8, "little") + b"{x"))], "not JSON"),
        ([_with_header([1])], "not a JSON object"),
        ([_with_header({"a": {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]}})], "BF16"),
        ([_with_header({"a": F32})], "0..8"),
        ([_with_header({"a": {**F32, "data_offsets": [0, 4]}}, b"0" * 8)], "0..4"),
        ([_with_header({"a": F32}, b"0" * 4), memoryview(bytearray(4))], "across two frames"),
    ],
)
def test_a_payload_that_is_not_the_layout_is_refused(frames: list[memoryview], reason: str) -> None:
    with pytest.raises(PayloadError, match=reason):
        arrays_in_place(frames)
