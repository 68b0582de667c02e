"""The cloud's buffer disk fills up under a robot's upload: the robot is refused by name
(RESOURCE_EXHAUSTED, "buffer disk full ... (retry)"), keeps its steps in its spool and retries
with a growing backoff; once space is back every step is stored without a restart, and the
run's events say when the disk filled and when it stored again. An episode mark is refused
the same way and stored from the robot's outbox once space is back."""

from __future__ import annotations

import time
from typing import Any

import grpc
import pytest
from sqlalchemy import select

import foundation.durable
from buffer import ReplayBuffer
from comms.cloud.replay_buffer_sink import ReplayBufferSink
from comms.robot.mark_sender import EpisodeMarkSender
from comms.robot.uploader import MemorySpool, Uploader
from comms.wire.marks import EpisodeMark
from foundation.store.metadata_store import MetadataStore
from foundation.store.models import Event
from tests.comms.helpers import BUFFER_SCHEMA as SCHEMA
from tests.comms.helpers import Outbox, rpc_code
from tests.comms.helpers import buffer_steps as records
from tests.fakes.cloud import RUN, Cloud
from tests.fakes.disk import Disk
from tests.fakes.procs import wait_until
from tests.fakes.settings import fast_comms


def _events(store: MetadataStore) -> list[tuple[str, dict[str, Any]]]:
    with store.session() as s:
        rows = s.scalars(select(Event).where(Event.run_id == RUN).order_by(Event.id)).all()
        return [(e.kind, dict(e.data)) for e in rows if e.kind.startswith("buffer.")]


def test_a_full_buffer_disk_is_a_named_retryable_refusal_and_heals(
    full_disk: Disk, store: MetadataStore
) -> None:
    buf = ReplayBuffer.open(full_disk.path / "buf", SCHEMA)
    cloud = Cloud(store, ReplayBufferSink(buf), fast_comms(reconnect_max_s=4.0))
    robot = cloud.robot("arm-1")
    client = cloud.client(robot)
    spool = MemorySpool()
    up = Uploader(client, RUN, spool)
    n = 0
    try:
        for _ in range(4):
            spool.put(records(robot.robot_id, n, 8))
            n += 8
        assert up.wait_durable(n - 1, 20), up.last_error
        full_disk.fill()
        for _ in range(40):  # more than the last pages of the disk hold
            spool.put(records(robot.robot_id, n, 8))
            n += 8
        wait_until(
            lambda: "buffer disk full" in (up.last_error or ""), 20, lambda: str(up.last_error)
        )
        assert "RESOURCE_EXHAUSTED" in str(up.last_error) and "(retry)" in str(up.last_error)
        wait_until(lambda: _events(store), 10, lambda: "no buffer event")
        ((kind, data),) = _events(store)
        assert kind == "buffer.disk_full" and "buffer disk full" in data["reason"]
        durable = up.durable_seq
        assert len(spool) > 0 and durable < n - 1  # the refused steps wait in the spool
        reconnects = up.reconnects
        time.sleep(4.0)
        # The delay grows while refused (0.05 s doubling towards 4 s: 6 tries in 4 s at
        # most); one that did not grow would give 13 or more.
        assert up.reconnects - reconnects <= 8, up.reconnects - reconnects
        assert up.durable_seq == durable
        full_disk.free()  # no restart of anything
        assert up.wait_durable(n - 1, 30), up.last_error  # within the 4 s delay
        assert len(spool) == 0
        assert [int(s) for s in buf.stored_seqs(robot.robot_id)] == list(range(n))
        wait_until(lambda: len(_events(store)) == 2, 10, lambda: str(_events(store)))
        kinds = [k for k, _ in _events(store)]
        assert kinds == ["buffer.disk_full", "buffer.disk_recovered"]
        assert _events(store)[1][1]["refused_for_s"] >= 4.0
    finally:
        full_disk.free()
        up.close()
        client.close()
        cloud.close()
        buf.close()
    with ReplayBuffer.open(full_disk.path / "buf") as again:
        assert [int(s) for s in again.stored_seqs(robot.robot_id)] == list(range(n))


def test_an_episode_mark_on_a_full_disk_is_a_named_retryable_refusal(
    full_disk: Disk, store: MetadataStore, caplog: pytest.LogCaptureFixture
) -> None:
    full_disk.cover(foundation.durable)  # the marks file is appended with append_line
    buf = ReplayBuffer.open(full_disk.path / "buf", SCHEMA)
    cloud = Cloud(store, ReplayBufferSink(buf), fast_comms(reconnect_max_s=0.5))
    robot = cloud.robot("arm-1")
    client = cloud.client(robot)
    mark = EpisodeMark(RUN, 3, "discard", "gamepad")
    outbox = Outbox()
    sender: EpisodeMarkSender | None = None
    try:
        full_disk.fill()
        with pytest.raises(grpc.RpcError) as err:
            client.mark_episode(mark)
        assert rpc_code(err.value) == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "buffer disk full" in (err.value.details() or ""), err.value.details()
        assert "Traceback" not in caplog.text and "internal error" not in caplog.text
        outbox.marks.append(mark)
        sender = EpisodeMarkSender(client, outbox)
        wait_until(lambda: "RESOURCE_EXHAUSTED" in (sender.last_error or ""), 10, "a refusal")
        assert outbox.marks == [mark] and not buf.index.discards  # kept on the robot
        full_disk.free()
        wait_until(lambda: not outbox.marks, 20, lambda: str(sender.last_error))
        assert sender.stored == 1 and sender.refused == 0
        assert (RUN, str(robot.robot_id), 3) in buf.index.discards
    finally:
        full_disk.free()
        if sender is not None:
            sender.close()
        client.close()
        cloud.close()
        buf.close()
    with ReplayBuffer.open(full_disk.path / "buf") as again:  # the mark is durable
        assert (RUN, str(robot.robot_id), 3) in again.index.discards
