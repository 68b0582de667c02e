"""The Episodes service: a robot's marks on its own episodes, stored in the run's sink; refusals
are named; the sender keeps a mark until the cloud stored it (through a cloud restart, and
through a site relay)."""

from __future__ import annotations

import grpc
import pytest

from comms.cloud.step_sink import MemorySink
from comms.proto import robofleet_pb2 as pb
from comms.relay.site_relay import SiteRelay
from comms.robot.client import EdgeClient, make_channel
from comms.robot.mark_sender import EpisodeMarkSender
from comms.wire.marks import EpisodeMark
from tests.comms.helpers import Outbox, rpc_code
from tests.fakes.cloud import RUN, Cloud
from tests.fakes.procs import wait_until


def test_a_mark_is_stored_for_the_calling_robot_and_bad_ones_are_named(store) -> None:
    sink = MemorySink()
    cloud = Cloud(store, {RUN: sink}.get)  # one run's sink: other runs are unknown
    robot = cloud.robot("arm-1")
    client = cloud.client(robot)
    try:
        assert client.mark_episode(EpisodeMark(RUN, 4, "rerecord", "keyboard")) == 0
        assert client.mark_episode(EpisodeMark(RUN, 4, "rerecord")) == 0  # again: no change
        assert sink.marks == {(robot.robot_id, RUN, 4): "rerecord"}
        # A kept episode's outcome: stored beside the verdicts, excluding nothing.
        assert client.mark_episode(EpisodeMark(RUN, 5, "success", "driver")) == 0
        assert sink.outcomes == {(robot.robot_id, RUN, 5): "success"}
        assert len(sink.marks) == 1
        stub = client._episodes
        for msg, field in (
            (pb.EpisodeMark(episode_index=1, kind=pb.EpisodeMark.DISCARD), "run_id"),
            (pb.EpisodeMark(run_id=RUN, episode_index=1), "kind"),
            (pb.EpisodeMark(run_id=RUN, episode_index=-1, kind=1), "episode_index"),
        ):
            with pytest.raises(grpc.RpcError) as err:
                stub.Mark(msg, metadata=client.metadata, timeout=5)
            assert rpc_code(err.value) == grpc.StatusCode.INVALID_ARGUMENT
            assert field in (err.value.details() or "")
        with pytest.raises(grpc.RpcError) as err:
            client.mark_episode(EpisodeMark("no-such-run", 1, "discard"))
        assert rpc_code(err.value) == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as err:
            stub.Mark(pb.EpisodeMark(run_id=RUN, kind=1), timeout=5)  # no credential
        assert rpc_code(err.value) == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(ValueError, match="unknown episode mark 'keep'"):
            client.mark_episode(EpisodeMark(RUN, 1, "keep"))
    finally:
        client.close()
        cloud.close()


def test_the_sender_keeps_a_mark_until_a_restarted_cloud_stored_it(cloud: Cloud) -> None:
    robot = cloud.robot("arm-1")
    cloud.stop()  # the cloud is away when the operator discards the episode
    client = cloud.client(robot)
    outbox = Outbox(EpisodeMark(RUN, 2, "discard", "gamepad"))
    sender = EpisodeMarkSender(client, outbox)
    try:
        wait_until(lambda: sender.last_error is not None, 10, "a failed try")
        assert outbox.marks and not cloud.sink.marks
        cloud.start()
        wait_until(lambda: not outbox.marks, 20, "the mark stored after the restart")
        assert cloud.sink.marks == {(robot.robot_id, RUN, 2): "discard"} and sender.stored == 1
    finally:
        sender.close()
        client.close()


def test_a_site_relay_forwards_marks_with_the_robots_own_credential(cloud: Cloud) -> None:
    robot = cloud.robot("arm-1")
    relay = SiteRelay(cloud.settings, cloud_address=cloud.address, port=0, zmq_port=0)
    relay.start()
    settings = cloud.settings
    client = EdgeClient(make_channel(relay.address, settings), robot.credential, settings)
    try:
        client.mark_episode(EpisodeMark(RUN, 9, "discard"))
        assert cloud.sink.marks == {(robot.robot_id, RUN, 9): "discard"}
        bad = EdgeClient(make_channel(relay.address, settings), "not-a-credential", settings)
        with pytest.raises(grpc.RpcError) as err:
            bad.mark_episode(EpisodeMark(RUN, 9, "discard"))
        assert rpc_code(err.value) == grpc.StatusCode.UNAUTHENTICATED
        bad.close()
    finally:
        client.close()
        relay.stop()


def test_memory_sink_counts_the_steps_a_mark_excludes() -> None:
    import pyarrow as pa

    sink = MemorySink()
    rows = pa.RecordBatch.from_pydict(
        {"seq": pa.array([0, 1, 2], pa.int64()), "episode_index": pa.array([0, 0, 1], pa.int64())}
    )
    sink.append(5, rows)
    assert sink.mark_episode(5, RUN, 0, "discard") == 2
