"""Weight files from a learner process: atomic one-copy writes, the cloud's feed publishes them."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from comms import tensors as T
from comms.distributor import WeightDistributor
from comms.weight_file import WeightFileFeed, read_weights, weight_file_name, write_weights


def _state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(300, 200, generator=g),
        "b": torch.randn(200, generator=g).to(torch.bfloat16),
        "steps": torch.tensor([seed], dtype=torch.int64),
    }


def test_written_file_is_safetensors_with_the_same_tensors(tmp_path: Path) -> None:
    state = _state(1)
    path = tmp_path / weight_file_name(3)
    size = write_weights(path, state)
    assert path.stat().st_size == size
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left
    from safetensors.torch import load_file

    loaded = load_file(str(path))  # the reference reader agrees with our layout
    assert loaded.keys() == state.keys()
    for k, v in state.items():
        assert torch.equal(loaded[k], v)
    blob = read_weights(path)
    assert T.decode(blob)["w"][1].tobytes() == state["w"].numpy().tobytes()


def test_feed_publishes_the_newest_file_once_and_refuses_a_broken_one(tmp_path: Path) -> None:
    pub = WeightDistributor("run-1")
    (tmp_path / weight_file_name(1)).write_bytes(b"\xff" * 64)  # not safetensors
    feed = WeightFileFeed(pub, tmp_path, poll_s=3600)  # polled by hand below
    try:
        assert not feed.poll()
        assert feed.refused == 1 and pub.latest() is None
        write_weights(tmp_path / weight_file_name(2), _state(2))
        write_weights(tmp_path / weight_file_name(5), _state(5))
        assert feed.poll()
        assert not feed.poll()  # the same version is not published twice
        assert pub.flush(10)
        latest = pub.latest()
        assert latest is not None and latest.version == 5
        got = T.decode(latest.full.payload)["w"][1]
        np.testing.assert_array_equal(got, _state(5)["w"].numpy())
        assert sorted(p.name for p in tmp_path.iterdir()) == [weight_file_name(5)]
    finally:
        feed.close()
        pub.close()


def _version(pub: WeightDistributor) -> int:
    latest = pub.latest()
    return -1 if latest is None else latest.version


def test_feed_thread_follows_new_files(tmp_path: Path) -> None:
    pub = WeightDistributor("run-1")
    feed = WeightFileFeed(pub, tmp_path, poll_s=0.01)
    try:
        for v in (1, 2):
            write_weights(tmp_path / weight_file_name(v), _state(v))
            deadline = time.monotonic() + 10
            while _version(pub) < v and time.monotonic() < deadline:
                time.sleep(0.01)
            assert _version(pub) == v
        assert feed.published == 2
    finally:
        feed.close()
        pub.close()


def test_publish_safetensors_refuses_bytes_that_are_not_safetensors() -> None:
    pub = WeightDistributor("run-1")
    try:
        with pytest.raises(T.TensorFormatError):
            pub.publish_safetensors(bytearray(b"\x00" * 4))
        with pytest.raises(ValueError, match="not above"):
            pub.publish_safetensors(T.encode({"a": np.zeros(3, np.float32)}), version=0)
            pub.publish_safetensors(T.encode({"a": np.zeros(3, np.float32)}), version=0)
    finally:
        pub.close()


def test_weight_file_name_rejects_negative_versions() -> None:
    with pytest.raises(ValueError, match="outside"):
        weight_file_name(-1)


def test_flush_waits_for_the_version_being_encoded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: flush returned while the publisher thread held a snapshot it had taken off
    the queue but not yet stored (``latest()`` was still None)."""
    import comms.distributor as distributor_mod

    real_encode = distributor_mod.W.encode_full
    started = threading.Event()

    def slow_encode(*args: object, **kwargs: object) -> object:
        started.set()
        time.sleep(0.5)
        return real_encode(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(distributor_mod.W, "encode_full", slow_encode)
    pub = WeightDistributor("run-1")
    try:
        pub.publish(_state(3), version=3)
        assert started.wait(5)  # the thread has taken the snapshot: _pending is None now
        assert pub.flush(10)
        latest = pub.latest()
        assert latest is not None and latest.version == 3
    finally:
        pub.close()


def test_publishing_threads_run_at_a_lower_os_priority(tmp_path: Path) -> None:
    import os

    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    pub = WeightDistributor("run-nice", thread_nice=5)
    feed = WeightFileFeed(pub, tmp_path, poll_s=0.01, thread_nice=3)
    try:
        write_weights(tmp_path / weight_file_name(1), {"w": np.ones(10, np.float32)})
        deadline = time.monotonic() + 10
        while pub.latest() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pub.latest() is not None
        by_name = {t.name: t.native_id for t in threading.enumerate()}
        enc_tid, feed_tid = by_name["weights-run-nice"], by_name["weight-file-feed"]
        assert enc_tid is not None and feed_tid is not None
        assert os.getpriority(os.PRIO_PROCESS, enc_tid) == min(19, base + 5)
        assert os.getpriority(os.PRIO_PROCESS, feed_tid) == min(19, base + 3)
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base
    finally:
        feed.close()
        pub.close()
