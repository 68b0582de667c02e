"""The learner -> cloud weight handoff: a directory of versions written atomically and durably,
found again after a restart, published to the distributor by the cloud's feed."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from comms.cloud.distributor import WeightDistributor
from comms.cloud.weight_file import (
    WeightDirectory,
    WeightFileFeed,
    latest_version,
    read_weights,
    weight_file_name,
)
from comms.wire import tensors as T
from foundation.contracts import WeightPublisher


def _state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(300, 200, generator=g),
        "b": torch.randn(200, generator=g).to(torch.bfloat16),
        "steps": torch.tensor([seed], dtype=torch.int64),
    }


def test_a_version_is_a_safetensors_file_named_by_the_pointer(tmp_path: Path) -> None:
    state = _state(1)
    directory = WeightDirectory(tmp_path)
    assert isinstance(directory, WeightPublisher)  # the learner's contract
    assert directory.latest_version() == 0
    directory.publish(3, state)
    name = weight_file_name(3)
    assert name == "v00000003.safetensors"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.json", name]  # no temp file
    assert json.loads((tmp_path / "latest.json").read_text()) == {"version": 3, "file": name}
    loaded = load_file(str(tmp_path / name))  # the reference reader agrees with our layout
    assert loaded.keys() == state.keys()
    for k, v in state.items():
        assert torch.equal(loaded[k], v)
    blob = read_weights(tmp_path / name)
    assert T.decode(blob)["w"][1].tobytes() == state["w"].numpy().tobytes()


def test_a_restarted_learner_finds_its_latest_version_and_never_reuses_one(
    tmp_path: Path,
) -> None:
    first = WeightDirectory(tmp_path, keep=2)
    for v in (1, 2, 3):
        first.publish(v, _state(v))
    # A crash mid-write leaves at most a temporary file: it is never taken for a version.
    (tmp_path / ".v00000004.safetensors.123.tmp").write_bytes(b"\x00" * 10)
    again = WeightDirectory(tmp_path, keep=2)
    assert again.latest_version() == latest_version(tmp_path) == 3
    with pytest.raises(ValueError, match="not above"):
        again.publish(3, _state(3))
    versions = sorted(p.name for p in tmp_path.glob("v*.safetensors"))
    assert versions == [weight_file_name(2), weight_file_name(3)]  # the newest ``keep``


def test_old_versions_are_removed_by_number_not_by_name(tmp_path: Path) -> None:
    directory = WeightDirectory(tmp_path, keep=1)
    directory.publish(99_999_999, {"w": np.zeros(2, np.float32)})
    directory.publish(100_000_000, {"w": np.ones(2, np.float32)})  # a ninth digit
    assert [p.name for p in tmp_path.glob("v*.safetensors")] == ["v100000000.safetensors"]
    assert directory.latest_version() == 100_000_000


def test_weight_file_name_rejects_negative_versions() -> None:
    with pytest.raises(ValueError, match="negative"):
        weight_file_name(-1)


def test_feed_publishes_the_newest_version_once_and_refuses_a_broken_one(tmp_path: Path) -> None:
    dist = WeightDistributor("run-1")
    (tmp_path / weight_file_name(1)).write_bytes(b"\xff" * 64)  # not safetensors
    (tmp_path / "latest.json").write_text(json.dumps({"version": 1, "file": weight_file_name(1)}))
    feed = WeightFileFeed(dist, tmp_path)
    try:
        assert feed.poll() is None
        assert feed.refused == 1 and dist.latest() is None
        directory = WeightDirectory(tmp_path)
        directory.publish(2, _state(2))
        directory.publish(5, _state(5))
        got = feed.poll()
        assert got is not None and got[0] == 5 and feed.published == 1
        assert T.decode(got[1])["steps"][1].tolist() == [5]  # its bytes, for the evaluator
        assert feed.poll() is None  # the same version is not published twice
        assert dist.flush(10)
        latest = dist.latest()
        assert latest is not None and latest.version == 5
        np.testing.assert_array_equal(T.decode(latest.full.payload)["w"][1], _state(5)["w"].numpy())
    finally:
        dist.close()


def test_feed_reads_a_version_the_distributor_holds_already_without_republishing(
    tmp_path: Path,
) -> None:
    dist = WeightDistributor("run-1")  # e.g. kept across a cloud restart, ahead of the files
    try:
        dist.publish({"w": np.zeros(3, np.float32)}, version=7)
        WeightDirectory(tmp_path).publish(5, _state(5))
        got = WeightFileFeed(dist, tmp_path).poll()
        assert got is not None and got[0] == 5  # read (the run's evaluation snapshot) ...
        assert dist.last_version == 7  # ... but not published below the distributor
    finally:
        dist.close()


def test_feed_reads_a_directory_written_by_the_previous_writer(tmp_path: Path) -> None:
    """A run directory from before the handoff had one owner (safetensors' own writer, same
    names and pointer) resumes as it is."""
    save_file({"w": torch.ones(4)}, str(tmp_path / "v00000004.safetensors"))
    (tmp_path / "latest.json").write_text(
        json.dumps({"version": 4, "file": "v00000004.safetensors"})
    )
    assert WeightDirectory(tmp_path).latest_version() == 4
    dist = WeightDistributor("run-1")
    try:
        got = WeightFileFeed(dist, tmp_path).poll()
        assert got is not None and got[0] == 4 and dist.last_version == 4
    finally:
        dist.close()


def test_feed_skips_the_versions_before_its_learner(tmp_path: Path) -> None:
    directory = WeightDirectory(tmp_path)
    directory.publish(3, _state(3))  # the last attempt's
    dist = WeightDistributor("run-1")
    try:
        feed = WeightFileFeed(dist, tmp_path, after_version=directory.latest_version())
        assert feed.poll() is None and dist.latest() is None
        directory.publish(4, _state(4))  # the new learner's first
        got = feed.poll()
        assert got is not None and got[0] == 4 and dist.last_version == 4
    finally:
        dist.close()


def _version(dist: WeightDistributor) -> int:
    latest = dist.latest()
    return -1 if latest is None else latest.version


def test_feed_thread_follows_new_versions(tmp_path: Path) -> None:
    dist = WeightDistributor("run-1")
    feed = WeightFileFeed(dist, tmp_path).start(poll_s=0.01)
    directory = WeightDirectory(tmp_path)
    try:
        for v in (1, 2):
            directory.publish(v, _state(v))
            deadline = time.monotonic() + 10
            while _version(dist) < v and time.monotonic() < deadline:
                time.sleep(0.01)
            assert _version(dist) == v
        assert feed.published == 2
    finally:
        feed.close()
        dist.close()


def test_publishing_threads_run_at_a_lower_os_priority(tmp_path: Path) -> None:
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    dist = WeightDistributor("run-nice", thread_nice=5)
    feed = WeightFileFeed(dist, tmp_path).start(poll_s=0.01, thread_nice=3)
    try:
        WeightDirectory(tmp_path).publish(1, {"w": np.ones(10, np.float32)})
        deadline = time.monotonic() + 10
        while dist.latest() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert dist.latest() is not None
        by_name = {t.name: t.native_id for t in threading.enumerate()}
        enc_tid, feed_tid = by_name["weights-run-nice"], by_name["weight-file-feed"]
        assert enc_tid is not None and feed_tid is not None
        assert os.getpriority(os.PRIO_PROCESS, enc_tid) == min(19, base + 5)
        assert os.getpriority(os.PRIO_PROCESS, feed_tid) == min(19, base + 3)
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base
    finally:
        feed.close()
        dist.close()
