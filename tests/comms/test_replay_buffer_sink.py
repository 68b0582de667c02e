"""End to end into the real replay buffer: gRPC upload -> ReplayBuffer (fsync) -> ack."""

from __future__ import annotations

import logging
from pathlib import Path

import grpc
import numpy as np
import pyarrow as pa
import pytest

from buffer import ReplayBuffer
from comms.cloud.replay_buffer_sink import ReplayBufferSink
from comms.robot.client import make_channel
from comms.robot.uploader import MemorySpool, Uploader
from foundation.store.metadata_store import MetadataStore
from tests.comms.helpers import BUFFER_SCHEMA, buffer_steps
from tests.fakes.cloud import RUN, Cloud


def test_upload_lands_in_the_buffer_and_survives_reopen(
    tmp_path: Path, store: MetadataStore
) -> None:
    buf = ReplayBuffer.open(tmp_path / "buf", BUFFER_SCHEMA)
    cloud = Cloud(store, ReplayBufferSink(buf))
    robot = cloud.robot("arm-1")
    client = cloud.client(robot)
    spool = MemorySpool()
    up = Uploader(client, RUN, spool)
    try:
        for i in range(5):
            spool.put(buffer_steps(robot.robot_id, i * 8, 8))
        assert up.wait_durable(39, 20), up.last_error
        # A resent batch (the robot never saw its ack) is acknowledged, not stored twice.
        assert (
            ReplayBufferSink(buf).append(robot.robot_id, buffer_steps(robot.robot_id, 32, 8)) == 39
        )
    finally:
        up.close()
        client.close()
        cloud.close()
        buf.close()
    reopened = ReplayBuffer.open(tmp_path / "buf")
    try:
        assert reopened.num_steps == 40
        assert ReplayBufferSink(reopened).durable_seq(robot.robot_id) == 39
        batch = reopened.sample(16)
        assert set(batch["robot_id"]) == {str(robot.robot_id)}
        np.testing.assert_array_equal(batch["observation.state"][:, 0], -batch["action"][:, 0])
    finally:
        reopened.close()


def test_rows_the_buffer_refuses_get_invalid_argument(tmp_path: Path, store: MetadataStore) -> None:
    buf = ReplayBuffer.open(tmp_path / "buf", BUFFER_SCHEMA)
    cloud = Cloud(store, ReplayBufferSink(buf))
    robot = cloud.robot("arm-1")
    from comms.proto import robofleet_pb2 as pb
    from comms.proto import robofleet_pb2_grpc as rpc
    from comms.wire import steps as S
    from comms.wire.credentials import credential_metadata

    bad = pa.RecordBatch.from_pydict(
        {"robot_id": [str(robot.robot_id)], "seq": pa.array([0], pa.int64())}
    )  # lacks every other column of the schema
    ch = make_channel(cloud.address, cloud.settings)
    try:
        msgs = [pb.StepBatch(run_id=RUN), pb.StepBatch(run_id=RUN, arrow_ipc=S.encode_batch(bad))]
        with pytest.raises(grpc.RpcError) as err:
            list(
                rpc.ExperienceStub(ch).Upload(
                    iter(msgs), metadata=credential_metadata(robot.credential), timeout=10
                )
            )
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
        assert "'run_id' is missing" in err.value.details()  # type: ignore[attr-defined]
        assert buf.num_steps == 0
    finally:
        ch.close()
        cloud.close()
        buf.close()


def test_a_closed_buffer_is_unavailable_without_a_traceback(
    tmp_path: Path, store: MetadataStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A run's buffer closes while its robots upload (the run stops, the cloud shuts down):
    the robot hears UNAVAILABLE and keeps its steps; the cloud logs no error."""
    from comms.proto import robofleet_pb2 as pb
    from comms.proto import robofleet_pb2_grpc as rpc
    from comms.wire import steps as S
    from comms.wire.credentials import credential_metadata

    buf = ReplayBuffer.open(tmp_path / "buf", BUFFER_SCHEMA)
    cloud = Cloud(store, ReplayBufferSink(buf))
    robot = cloud.robot("arm-1")
    buf.close()
    ch = make_channel(cloud.address, cloud.settings)
    batch = S.encode_batch(buffer_steps(robot.robot_id, 0, 8))
    try:
        msgs = [pb.StepBatch(run_id=RUN), pb.StepBatch(run_id=RUN, arrow_ipc=batch)]
        with pytest.raises(grpc.RpcError) as err:
            list(
                rpc.ExperienceStub(ch).Upload(
                    iter(msgs), metadata=credential_metadata(robot.credential), timeout=10
                )
            )
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
        assert "closed" in err.value.details()  # type: ignore[attr-defined]
        mark = pb.EpisodeMark(run_id=RUN, episode_index=0, kind=pb.EpisodeMark.DISCARD)
        with pytest.raises(grpc.RpcError) as err:
            rpc.EpisodesStub(ch).Mark(
                mark, metadata=credential_metadata(robot.credential), timeout=10
            )
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
    finally:
        ch.close()
        cloud.close()
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_a_buffer_shard_that_is_away_is_backpressure_for_lookups_and_marks() -> None:
    # A sharded run's buffer refuses while a shard process restarts: the robot sends again.
    from buffer import BackpressureError
    from comms.cloud.step_sink import Backpressure

    class Away:
        def durable_seq(self, robot_id: object) -> int:
            raise BackpressureError("buffer shard 0 is away", 1.5)

        def mark_episode(self, *args: object) -> int:
            raise BackpressureError("buffer shard 0 is away", 1.5)

    sink = ReplayBufferSink(Away())  # type: ignore[arg-type]
    with pytest.raises(Backpressure) as lookup:
        sink.durable_seq(7)
    assert lookup.value.retry_after_s == 1.5
    with pytest.raises(Backpressure):
        sink.mark_episode(7, RUN, 0, "success")
