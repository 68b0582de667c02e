"""Experience upload: acks after the sink, resume after a cloud restart without duplicates,
batches over 4 MB, backpressure, a frozen client."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

import grpc
import pyarrow as pa
import pytest

from comms.cloud.step_sink import MemorySink
from comms.robot.uploader import MemorySpool, Uploader
from foundation.store.metadata_store import MetadataStore
from tests.comms.helpers import HOLDING_CLIENT, rpc_code, steps
from tests.fakes.cloud import RUN, Cloud
from tests.fakes.settings import fast_comms


def test_batches_are_acknowledged_in_order(cloud: Cloud) -> None:
    robot = cloud.robot("arm-1")
    client = cloud.client(robot)
    spool = MemorySpool()
    up = Uploader(client, RUN, spool)
    for i in range(20):
        spool.put(steps(robot.robot_id, i * 5, 5))
    assert up.wait_durable(99, 10)
    assert cloud.sink.seqs(robot.robot_id) == list(range(100))
    assert len(spool) == 0
    up.close()
    client.close()


def test_spool_refuses_seq_going_backwards() -> None:
    from comms.wire.steps import StepFormatError

    spool = MemorySpool()
    spool.put(steps(1, 0, 5))
    with pytest.raises(StepFormatError, match="does not follow"):
        spool.put(steps(1, 3, 5))


def test_batch_over_4mb_is_split_and_reassembled(cloud: Cloud) -> None:
    robot = cloud.robot("arm-1")
    client = cloud.client(robot)
    spool = MemorySpool()
    up = Uploader(client, RUN, spool)
    big = steps(robot.robot_id, 0, 10, payload_bytes=1_000_000)  # 10 MB in one batch
    spool.put(big)
    assert up.wait_durable(9, 20)
    ((rid, got),) = cloud.sink.batches
    assert rid == robot.robot_id and got.equals(big)
    up.close()
    client.close()


def test_reconnect_after_server_restart_resumes_without_duplicates(store: MetadataStore) -> None:
    sink = MemorySink()  # outlives the server, like the buffer on disk
    cloud = Cloud(store, sink)
    robot = cloud.robot("arm-1")
    client = cloud.client(robot)
    spool = MemorySpool()
    up = Uploader(client, RUN, spool)
    for i in range(10):
        spool.put(steps(robot.robot_id, i * 10, 10))
    assert up.wait_durable(99, 10)
    cloud.stop()
    for i in range(10, 20):  # produced while the cloud is down: spooled
        spool.put(steps(robot.robot_id, i * 10, 10))
    time.sleep(1.0)
    assert up.durable_seq == 99 and len(spool) == 10
    cloud.start()  # on the same port, with the same sink
    try:
        assert up.wait_durable(199, 20), up.last_error
        assert sink.seqs(robot.robot_id) == list(range(200))  # each exactly once
        assert up.reconnects >= 1
    finally:
        up.close()
        client.close()
        cloud.close()


def test_backpressure_pauses_and_loses_nothing(store: MetadataStore) -> None:
    sink = MemorySink(capacity_rows=30)
    cloud = Cloud(store, sink, fast_comms(upload_window=4))
    robot = cloud.robot("arm-1")
    client = cloud.client(robot)
    spool = MemorySpool()
    up = Uploader(client, RUN, spool)
    try:
        for i in range(10):
            spool.put(steps(robot.robot_id, i * 10, 10))
        deadline = time.monotonic() + 10
        while up.backpressured == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert up.backpressured > 0 and up.durable_seq < 99
        sink.capacity_rows = None  # the learner caught up
        assert up.wait_durable(99, 20)
        assert sink.seqs(robot.robot_id) == list(range(100))
    finally:
        up.close()
        client.close()
        cloud.close()


def test_the_byte_window_holds_one_batch_in_flight_when_it_is_smaller(
    store: MetadataStore,
) -> None:
    class CountingSink(MemorySink):
        """Notes the most batches the data plane had received beyond those stored."""

        dataplane: Any = None
        most_ahead = 0
        stored = 0

        def append(self, robot_id: int, batch: pa.RecordBatch) -> int:
            time.sleep(0.01)  # slow enough for a client to run ahead if it may
            ahead = self.dataplane.batches_received - self.stored
            self.most_ahead = max(self.most_ahead, ahead)
            self.stored += 1
            return super().append(robot_id, batch)

    sink = CountingSink()
    cloud = Cloud(store, sink, fast_comms(upload_window=32, upload_window_bytes=1))
    sink.dataplane = cloud.server.state.dataplane
    robot = cloud.robot("arm-1")
    client = cloud.client(robot)
    spool = MemorySpool()
    for i in range(10):
        spool.put(steps(robot.robot_id, i * 10, 10))
    up = Uploader(client, RUN, spool)
    try:
        assert up.wait_durable(99, 20), up.last_error
        assert sink.seqs(robot.robot_id) == list(range(100))
        assert up.data_plane_batches == 10
        assert sink.most_ahead == 1  # each batch waited for the ack of the one before
    finally:
        up.close()
        client.close()
        cloud.close()


def test_frozen_client_is_dropped_and_its_slot_freed(store: MetadataStore) -> None:
    sink = MemorySink()
    cloud = Cloud(store, sink, fast_comms(max_concurrent_streams=1, stream_idle_timeout_s=2.0))
    frozen_robot = cloud.robot("arm-frozen")
    robot = cloud.robot("arm-new")
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDING_CLIENT, cloud.address, frozen_robot.credential],
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.getcwd(),
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "streaming"
        os.kill(proc.pid, signal.SIGSTOP)  # frozen: holds its TCP connection, answers nothing
        assert cloud.server.stats()["active_streams"] == 1
        client = cloud.client(robot)
        with pytest.raises(grpc.RpcError) as err:  # the only slot is taken
            client.heartbeat("running", None, {})
        assert rpc_code(err.value) == grpc.StatusCode.RESOURCE_EXHAUSTED
        spool = MemorySpool()
        up = Uploader(client, RUN, spool)
        spool.put(steps(robot.robot_id, 0, 10))
        assert up.wait_durable(9, 20), up.last_error  # the frozen stream was dropped
        assert sink.seqs(robot.robot_id) == list(range(10))
        up.close()
        client.close()
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        cloud.close()
