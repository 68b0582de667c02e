"""Batches through shared memory (``buffer.service.shm_batches``): a batch server on the
learner's machine writes each batch into the learner's slot, shards side by side into one,
and the learner reads the slot's arrays; what cannot use a slot falls back to the socket."""

from __future__ import annotations

import gc
import mmap
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from buffer import BufferSettings, ReplayBuffer
from buffer.service.batches import BatchServer, RemoteBuffer
from buffer.service.sharded_batches import ShardedRemoteBuffer
from buffer.service.shards import ShardedBuffer
from buffer.service.shm_batches import (
    PREFIX,
    SHM_DIR,
    BatchSlots,
    ShmRefused,
    SlotWriter,
    layout_of,
    sweep_stale,
)
from tests.buffer.helpers import BATCH_TOKEN, episodes, small_schema

SETTINGS = {"segment_target_bytes": 4096, "memory_budget_bytes": 1 << 24}
LAYOUT = {"images": ["observation.images.front"], "next_images": True}


def _check_rows(batch: dict[str, np.ndarray]) -> None:
    """Every row's columns belong to one step (``tests.buffer.helpers.step``: the image
    holds the seq mod 251, the state and action the robot and seq)."""
    state = batch["observation.state"][:, 0]
    seq = (state.astype(np.int64) % 100_000) % 251
    assert (batch["observation.images.front"].reshape(len(seq), -1) == seq[:, None]).all()
    np.testing.assert_array_equal(batch["action"][:, 0], state)


def _in_slot(batch: dict[str, np.ndarray]) -> bool:
    base = batch["observation.images.front"].base
    if not isinstance(base, np.ndarray) or not isinstance(base.base, memoryview):
        return False
    return isinstance(base.base.obj, mmap.mmap)


def _slot_files() -> set[str]:
    return {n for n in os.listdir(SHM_DIR) if n.startswith(f"{PREFIX}{os.getpid()}-")}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[BatchServer]:
    buf = ReplayBuffer.open(tmp_path / "b", small_schema(), BufferSettings(**SETTINGS))
    for r in range(3):
        buf.append(episodes(r, [20, 20]))
    srv = BatchServer(buf, ["reach"], token=BATCH_TOKEN)
    yield srv
    srv.close()
    buf.close()


def test_a_server_on_this_machine_writes_batches_into_the_learners_slots(
    server: BatchServer,
) -> None:
    before = _slot_files()
    remote = RemoteBuffer(server.address, timeout_s=10, layout=LAYOUT, token=BATCH_TOKEN)
    try:
        first = remote.sample(32)  # over the socket: the server's machine is not known yet
        assert not _in_slot(first) and remote.shm_usable
        _check_rows(first)
        held = [remote.sample(32) for _ in range(3)]
        assert all(_in_slot(b) for b in held)
        for b in held:
            _check_rows(b)
            assert sorted(b) == sorted(first)
            assert all(b[k].dtype == first[k].dtype for k in first)
        # Held batches are never written over: three held, three slots.
        assert len(_slot_files() - before) == 3
        snapshot = {k: v.copy() for k, v in held[0].items()}
        for _ in range(5):
            remote.sample(32)
        for k, v in snapshot.items():
            np.testing.assert_array_equal(held[0][k], v)
        # Released, a slot is used again: no new file while the learner drops each batch.
        del held, b
        gc.collect()
        count = len(_slot_files())
        for _ in range(10):
            batch = remote.sample(32)
            assert _in_slot(batch)
            _check_rows(batch)
            del batch
        assert len(_slot_files()) == count
        # Another batch size: its own slot, the same rows' truth.
        _check_rows(remote.sample(17))
        big = remote.sample(17)
        assert _in_slot(big) and len(big["action"]) == 17
    finally:
        remote.close()
    assert _slot_files() == before  # the learner's files go with it


def test_without_shared_memory_every_batch_comes_over_the_socket(server: BatchServer) -> None:
    remote = RemoteBuffer(
        server.address, timeout_s=10, layout=LAYOUT, shared_memory=False, token=BATCH_TOKEN
    )
    try:
        for _ in range(3):
            batch = remote.sample(16)
            assert not _in_slot(batch)
            _check_rows(batch)
        assert not remote.shm_usable
    finally:
        remote.close()


def test_a_server_that_cannot_open_the_slot_sends_the_batch_and_says_why(
    server: BatchServer, caplog: pytest.LogCaptureFixture
) -> None:
    remote = RemoteBuffer(server.address, timeout_s=10, layout=LAYOUT, token=BATCH_TOKEN)
    try:
        remote.sample(8)
        assert remote.shm_usable and remote.slots is not None
        slot = remote.slots.take(8)
        assert slot is not None
        os.unlink(slot.path)  # as a server in a container with its own /dev/shm sees it
        remote.ask_sample(8, (slot, 0))
        batch = remote.take_sample()
        assert batch is not None and not _in_slot(batch)
        _check_rows(batch)
        assert not remote.shm_usable  # from now on over the socket
        assert "cannot see slot" in caplog.text
        assert not _in_slot(remote.sample(8))
    finally:
        remote.close()


def test_a_slot_of_other_columns_is_refused_and_the_learner_learns_them_again(
    server: BatchServer,
) -> None:
    remote = RemoteBuffer(server.address, timeout_s=10, layout=LAYOUT, token=BATCH_TOKEN)
    try:
        remote.sample(8)
        # The learner asks for more columns: the old slots' layout is refused by name, the
        # batch comes as frames, and the next one goes into a slot of the new columns.
        remote.layout = {"images": ["observation.images.front"], "next_images": False}
        batch = remote.sample(8)
        assert not _in_slot(batch) and remote.shm_usable
        again = remote.sample(8)
        assert _in_slot(again) and "next.observation.images.front" not in again
        _check_rows(again)
    finally:
        remote.close()


def test_the_writer_refuses_what_is_not_a_slot(tmp_path: Path) -> None:
    writer = SlotWriter()
    batch = {"x": np.arange(4, dtype=np.float32)}
    slots = BatchSlots()
    try:
        slots.learn(batch)
        slot = slots.take(4)
        assert slot is not None
        good = slot.spec(0)
        assert writer.write(good, batch) == 4
        np.testing.assert_array_equal(slot.arrays(0, 4)["x"], batch["x"])
        outside = tmp_path / f"{PREFIX}1-x"
        outside.write_bytes(b"\0" * 64)
        link = SHM_DIR / f"{PREFIX}{os.getpid()}-link"
        link.symlink_to(slot.path)
        cases = [
            ({**good, "path": str(outside)}, "is not a batch slot"),
            ({**good, "path": "/etc/passwd"}, "is not a batch slot"),
            ({**good, "path": str(link)}, "is not a regular file"),
            ({**good, "row0": 2}, "past the slot's 4"),
            ({**good, "columns": {"x": [0, "F32", [2]]}}, "the slot holds F32 [2]"),
            ({**good, "columns": {"y": [0, "F32", []]}}, "are not the batch's"),
            ({**good, "columns": {"x": [1 << 20, "F32", []]}}, "the request needs"),
            ({"path": slot.path}, "malformed slot request"),
        ]
        try:
            for into, reason in cases:
                with pytest.raises(ShmRefused, match=re.escape(reason)):
                    writer.write(into, batch)
        finally:
            link.unlink()
        # The slot is untouched by every refusal.
        np.testing.assert_array_equal(slot.arrays(0, 4)["x"], batch["x"])
    finally:
        slots.close()
        writer.close()


def test_columns_without_a_shared_memory_form_have_no_layout() -> None:
    assert layout_of({"x": np.zeros((2, 3), np.float32)}) == {"x": ("F32", (3,))}
    assert layout_of({"t": np.array(["a", "b"], dtype=object)}) is None
    assert layout_of({"s": np.float32(1.0).reshape(())}) is None


def test_the_slots_of_a_learner_that_died_are_swept() -> None:
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, numpy as np\n"
            "from buffer.service.shm_batches import BatchSlots\n"
            "s = BatchSlots(); s.learn({'x': np.zeros(4, np.float32)}); slot = s.take(4)\n"
            "print(slot.path, flush=True); os._exit(0)\n",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    left = Path(child.stdout.strip())
    assert left.exists()  # os._exit: nothing cleaned up
    assert sweep_stale() >= 1
    assert not left.exists()


def test_shards_write_their_parts_side_by_side_into_one_slot(tmp_path: Path) -> None:
    with ShardedBuffer.open(
        tmp_path / "b", small_schema(), BufferSettings(**SETTINGS), shards=2
    ) as buf:
        for r in range(6):
            buf.append(episodes(r, [15, 15]))
        servers = [BatchServer(s, ["reach"], token=BATCH_TOKEN) for s in buf.shards]
        remote = ShardedRemoteBuffer(
            [s.address for s in servers],
            timeout_s=10,
            layout=LAYOUT,
            seed=0,
            token=BATCH_TOKEN,
        )
        try:
            remote.sample(64)  # the servers' machine and the columns are learnt
            for _ in range(5):
                batch = remote.sample(64)
                assert _in_slot(batch) and len(batch["shard"]) == 64
                _check_rows(batch)
                # Each shard's rows are its own robots'.
                assert set(batch["shard"].tolist()) == {0, 1}
                assert (np.diff(batch["shard"]) >= 0).all()  # the parts side by side
                del batch
        finally:
            remote.close()
            for s in servers:
                s.close()


def test_no_room_in_dev_shm_means_batches_over_the_socket(
    server: BatchServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A container's /dev/shm of 64 MiB: the reservation fails at once (ENOSPC), never a
    # SIGBUS in the server writing into a file the filesystem cannot back.
    def full(fd: int, offset: int, size: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    remote = RemoteBuffer(server.address, timeout_s=10, layout=LAYOUT, token=BATCH_TOKEN)
    try:
        for _ in range(3):
            batch = remote.sample(16)
            assert not _in_slot(batch)
            _check_rows(batch)
        assert remote.slots is not None and "No space left" in remote.slots.failed
    finally:
        remote.close()


def test_a_server_unmaps_the_slots_of_a_learner_that_is_gone(
    server: BatchServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from buffer.service import shm_batches

    monkeypatch.setattr(shm_batches, "PURGE_EVERY_S", 0.0)
    first = RemoteBuffer(server.address, timeout_s=10, layout=LAYOUT, token=BATCH_TOKEN)
    for _ in range(3):
        first.sample(8)
    mapped = set(server._slots._mapped)  # noqa: SLF001
    assert mapped and all(p.startswith(str(SHM_DIR)) for p in mapped)
    first.close()  # its files are removed
    second = RemoteBuffer(server.address, timeout_s=10, layout=LAYOUT, token=BATCH_TOKEN)
    try:
        for _ in range(3):
            _check_rows(second.sample(8))
        assert not mapped & set(server._slots._mapped)  # noqa: SLF001
    finally:
        second.close()
