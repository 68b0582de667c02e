"""Acknowledged means stored (issue 16, finding 1), against a real server on loopback.

* A step below the stream's watermark that the sink never stored is refused by name (the
  stream ends with INVALID_ARGUMENT naming its seq), never acknowledged: it was acknowledged
  (``durable_seq`` of the higher batch) and dropped before the sink saw it.
* One live Upload stream per robot: a second one is refused naming the robot (two agents with
  one credential had their steps dropped as "duplicates" of each other's), the first keeps
  working, and the claim goes when the first stream ends, is cancelled or its peer dies.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pyarrow as pa
import pytest

from buffer import ReplayBuffer
from comms.cloud.replay_buffer_sink import ReplayBufferSink
from comms.cloud.step_sink import MemorySink
from comms.proto import robofleet_pb2 as pb
from comms.robot.client import EdgeClient
from comms.robot.uploader import MemorySpool, Uploader
from comms.wire import steps as S
from foundation.store.metadata_store import MetadataStore
from tests.comms.helpers import BUFFER_SCHEMA, HOLDING_CLIENT, buffer_steps, rpc_code, steps
from tests.fakes.cloud import RUN, Cloud

Feed = queue.Queue[pb.StepBatch | None]


def _requests(feed: Feed) -> Iterator[pb.StepBatch]:
    while (m := feed.get()) is not None:
        yield m


class _Stream:
    """One raw Upload stream: put a message, read the next ack (or the stream's error)."""

    def __init__(self, client: EdgeClient) -> None:
        self.feed: Feed = queue.Queue()
        self.call = client.experience.Upload(_requests(self.feed), metadata=client.metadata)

    def hello(self) -> int:
        self.feed.put(pb.StepBatch(run_id=RUN))
        return int(next(self.call).durable_seq)

    def send(self, msg: pb.StepBatch) -> int:
        """Send one batch made by :func:`_message` (built before the stream opened: its idle
        timeout is 3 s and a first pyarrow call may import pandas)."""
        self.feed.put(msg)
        return int(next(self.call).durable_seq)

    def end(self) -> None:
        """Half-close and wait for the server to finish the call."""
        self.feed.put(None)
        assert list(self.call) == []

    def cancel(self) -> None:
        self.feed.put(None)
        self.call.cancel()


def _message(batch: pa.RecordBatch) -> pb.StepBatch:
    last = int(batch.column("seq")[-1].as_py())
    return pb.StepBatch(run_id=RUN, last_seq=last, arrow_ipc=S.encode_batch(batch))


# (cloud, batch maker (robot_id, first seq, n), stored seqs of a robot)
Harness = tuple[Cloud, Callable[[int, int, int], pa.RecordBatch], Callable[[int], list[int]]]


@contextmanager
def _harness(kind: str, store: MetadataStore, tmp_path: Path) -> Iterator[Harness]:
    if kind == "memory":
        mem = MemorySink()
        with Cloud(store, mem) as cloud:
            yield cloud, steps, mem.seqs
        return
    buf = ReplayBuffer.open(tmp_path / "buf", BUFFER_SCHEMA)
    try:
        with Cloud(store, ReplayBufferSink(buf)) as cloud:
            yield cloud, buffer_steps, lambda rid: buf.stored_seqs(str(rid)).tolist()
    finally:
        buf.close()


@pytest.mark.parametrize("kind", ["memory", "buffer"])
def test_a_step_below_the_watermark_never_stored_is_refused_by_name_not_acked(
    kind: str, store: MetadataStore, tmp_path: Path
) -> None:
    with _harness(kind, store, tmp_path) as (cloud, batch, stored):
        robot = cloud.robot("arm-1")
        client = cloud.client(robot)
        rid = robot.robot_id
        first, high, resent, low = (
            _message(batch(rid, a, n)) for a, n in ((0, 6), (1000, 3), (3, 3), (500, 1))
        )
        stream = _Stream(client)
        try:
            assert stream.hello() == -1
            assert stream.send(first) == 5
            assert stream.send(high) == 1002
            assert stream.send(resent) == 1002  # a resend: acknowledged, stored once
            with pytest.raises(grpc.RpcError) as err:
                # Before: acknowledged with durable_seq 1002 and never stored.
                stream.send(low)
            assert rpc_code(err.value) == grpc.StatusCode.INVALID_ARGUMENT
            details = err.value.details()  # type: ignore[attr-defined]
            assert "500" in details and "never stored" in details, details
            assert stored(rid) == [0, 1, 2, 3, 4, 5, 1000, 1001, 1002]
        finally:
            stream.cancel()
            client.close()


def test_a_second_live_upload_stream_of_one_robot_is_refused_naming_the_robot(
    cloud: Cloud[MemorySink],
) -> None:
    """Two agents with one robot's credential: the second is refused while the first lives
    (before, both streamed and one's steps were acknowledged as the other's duplicates)."""
    robot = cloud.robot("arm-1")
    other = cloud.robot("arm-2")
    clients = [cloud.client(robot), cloud.client(robot), cloud.client(other)]
    msgs = [_message(steps(robot.robot_id, a, 5)) for a in (0, 5)]
    first, second, third = (_Stream(c) for c in clients)
    try:
        assert first.hello() == -1
        with pytest.raises(grpc.RpcError) as err:
            second.hello()
        assert rpc_code(err.value) == grpc.StatusCode.ALREADY_EXISTS
        assert "robot arm-1 already has a live upload stream" in err.value.details()  # type: ignore[attr-defined]
        assert third.hello() == -1  # another robot is not affected
        assert first.send(msgs[0]) == 4  # the first keeps working
        first.end()
        again = _Stream(clients[1])  # after the first ended, a new one is accepted
        assert again.hello() == 4
        assert again.send(msgs[0]) == 4  # a resend: stored once
        assert again.send(msgs[1]) == 9
        assert cloud.sink.seqs(robot.robot_id) == list(range(10))
        again.cancel()
    finally:
        for s in (first, second, third):
            s.cancel()
        for c in clients:
            c.close()


@contextmanager
def _holder(cloud: Cloud, credential: str) -> Iterator[subprocess.Popen[str]]:
    """A robot process with a live upload stream (its hello acknowledged)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDING_CLIENT, cloud.address, credential],
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.getcwd(),
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "streaming"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _refused(client: EdgeClient) -> bool:
    stream = _Stream(client)
    try:
        stream.hello()
        return False
    except grpc.RpcError as exc:
        assert rpc_code(exc) == grpc.StatusCode.ALREADY_EXISTS, exc
        return True
    finally:
        stream.cancel()


@pytest.mark.parametrize("death", ["killed", "frozen"])
def test_a_robot_whose_old_stream_died_reconnects(cloud: Cloud[MemorySink], death: str) -> None:
    """A robot computer that restarts: its old process was killed (the connection closes at
    once) or froze (the cloud notices by keepalive / the idle timeout). The claim goes with
    the old stream, and the new uploader gets its steps acknowledged."""
    robot = cloud.robot("arm-1")
    client = cloud.client(robot)
    spool = MemorySpool()
    up: Uploader | None = None
    try:
        with _holder(cloud, robot.credential) as proc:
            assert _refused(client)  # the held stream is live
            os.kill(proc.pid, signal.SIGKILL if death == "killed" else signal.SIGSTOP)
            spool.put(steps(robot.robot_id, 0, 10))
            up = Uploader(client, RUN, spool)
            # killed: as the connection closes; frozen: by keepalive (1 s + 1 s) or the idle
            # timeout (3 s)
            assert up.wait_durable(9, 10 if death == "killed" else 20), up.last_error
        assert cloud.sink.seqs(robot.robot_id) == list(range(10))
    finally:
        if up is not None:
            up.close()
        client.close()
