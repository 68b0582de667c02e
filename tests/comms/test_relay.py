"""Site relay: one copy of each version crosses the cloud link, fanned out to 4 robots over
ZeroMQ; uploads pass through with end-to-end acks; refusals still come from the cloud."""

from __future__ import annotations

import time

import grpc
import numpy as np
import pytest

import comms.robot.zmq_subscription as zmq_subscription
from comms.relay.site_relay import SiteRelay
from comms.robot.client import EdgeClient, make_channel
from comms.robot.receiver import WeightReceiver
from comms.robot.uploader import MemorySpool, Uploader
from comms.robot.zmq_subscription import ZmqWeightSubscription
from tests.comms.helpers import rpc_code, steps
from tests.comms.netproxy import TcpProxy
from tests.fakes.cloud import RUN, Cloud


def test_relay_fans_out_one_copy_per_version_to_four_robots(cloud: Cloud) -> None:
    link = TcpProxy(cloud.address)  # the "cloud link": counts bytes from the cloud
    relay = SiteRelay(cloud.settings, cloud_address=link.address, port=0, zmq_port=0)
    relay.start()
    robots = [cloud.robot(f"arm-{i}") for i in range(4)]
    clients = [
        EdgeClient(make_channel(relay.address, cloud.settings), r.credential, cloud.settings)
        for r in robots
    ]
    rxs = [WeightReceiver() for _ in robots]
    sources = [
        ZmqWeightSubscription(c, relay.zmq_address, RUN, rx)
        for c, rx in zip(clients, rxs, strict=True)
    ]
    pub = cloud.server.distributor(RUN)
    try:
        rng = np.random.default_rng(0)
        state = {
            "w": rng.standard_normal(2_000_000).astype(np.float32),
            "b": np.zeros(10, np.float32),
        }
        version_bytes = 8_000_040
        dp = cloud.server.state.dataplane

        def from_cloud() -> int:
            # The gRPC link plus the cloud's data plane (the relay takes chunks there).
            return link.bytes_down + (dp.weight_bytes_sent if dp is not None else 0)

        before = from_cloud()
        pub.publish(state)
        assert all(rx.wait_for(0, 30) for rx in rxs)
        first = from_cloud() - before
        # One copy of the version plus protocol overhead, not four copies.
        assert version_bytes <= first < 1.1 * version_bytes, first
        state["w"][:100] += 1.0
        before = from_cloud()
        pub.publish(state)
        assert all(rx.wait_for(1, 30) for rx in rxs)
        delta = from_cloud() - before
        assert delta < 20_000, delta  # 100 changed floats as a sparse delta, once
        for rx in rxs:
            np.testing.assert_array_equal(rx.current()[1]["w"], state["w"])
        # The relay republished the delta as it applied it: one payload, no second copy.
        run = relay.runs[RUN]
        assert run.distributor.flush(10)
        republished = run.distributor.latest()
        assert republished is not None and republished.version == 1
        _, held = run.receiver.current_arrays()
        assert np.shares_memory(np.frombuffer(republished.full.payload, np.uint8), held["w"][1])
        # A robot joining later catches up from the relay without touching the cloud link.
        late = WeightReceiver()
        before = from_cloud()
        late_src = ZmqWeightSubscription(clients[0], relay.zmq_address, RUN, late)
        assert late.wait_for(1, 30)
        assert from_cloud() - before < 20_000
        np.testing.assert_array_equal(late.current()[1]["w"], state["w"])
        late_src.close()
    finally:
        for s in sources:
            s.close()
        for c in clients:
            c.close()
        relay.stop()
        link.close()


def test_uploads_through_the_relay_are_acked_by_the_cloud(cloud: Cloud) -> None:
    relay = SiteRelay(cloud.settings, cloud_address=cloud.address, port=0, zmq_port=0)
    relay.start()
    robot = cloud.robot("arm-1")
    outsider = cloud.robot("arm-2", lease=None)
    client = EdgeClient(
        make_channel(relay.address, cloud.settings), robot.credential, cloud.settings
    )
    spool = MemorySpool()
    up = Uploader(client, RUN, spool)
    try:
        for i in range(10):
            spool.put(steps(robot.robot_id, i * 10, 10))
        assert up.wait_durable(99, 20), up.last_error
        assert cloud.sink.seqs(robot.robot_id) == list(range(100))
        # The relay holds no rights of its own: the cloud refuses an unleased robot.
        bad = EdgeClient(
            make_channel(relay.address, cloud.settings), outsider.credential, cloud.settings
        )
        rx = WeightReceiver()
        with pytest.raises(grpc.RpcError) as err:
            list(
                bad.weights.Fetch(
                    __import__("comms.proto.robofleet_pb2", fromlist=["x"]).FetchRequest(
                        run_id=RUN, version=-1, manifest_only=True
                    ),
                    metadata=bad.metadata,
                    timeout=5,
                )
            )
        assert rpc_code(err.value) == grpc.StatusCode.PERMISSION_DENIED
        assert rx.version == -1
        bad.close()
    finally:
        up.close()
        client.close()
        relay.stop()


def test_fanout_manifests_without_the_relays_hmac_are_never_applied(cloud: Cloud) -> None:
    """A host on the site LAN publishing its own 'version' (valid chunk digests, no key) is
    ignored; the key comes only over the relay's authenticated gRPC."""
    import zmq

    from comms.wire.dataplane_frames import CHUNK_HEADER
    from comms.wire.fanout import TOPIC_CHUNK, TOPIC_MANIFEST, manifest_tag
    from comms.wire.weight_codec import Snapshot, encode_full

    relay = SiteRelay(cloud.settings, cloud_address=cloud.address, port=0, zmq_port=0)
    relay.start()
    robot = cloud.robot("arm-1")
    client = EdgeClient(
        make_channel(relay.address, cloud.settings), robot.credential, cloud.settings
    )
    ctx = zmq.Context()
    rogue = ctx.socket(zmq.PUB)
    rogue_port = rogue.bind_to_random_port("tcp://127.0.0.1")
    rx = WeightReceiver()
    src = ZmqWeightSubscription(client, f"tcp://127.0.0.1:{rogue_port}", RUN, rx)
    try:
        fake = encode_full(RUN, Snapshot.take({"w": np.ones(1000, np.float32)}, 7))
        body = fake.manifest.SerializeToString()
        chunks = [[CHUNK_HEADER.pack(7, -1, i), fake.chunk(i)] for i in range(fake.num_chunks)]
        for tag in ([], [b"\x00" * 32], [manifest_tag(b"guessed key", body)]):
            for _ in range(10):  # the SUB socket may join late: repeat
                rogue.send_multipart([RUN.encode(), TOPIC_MANIFEST, body, *tag])
                for c in chunks:
                    rogue.send_multipart([RUN.encode(), TOPIC_CHUNK, *c])
                rogue.send_multipart([RUN.encode(), TOPIC_CHUNK, b"\xff\xfe", b"garbage"])
                time.sleep(0.05)
        assert not rx.wait_for(0, 1.0)  # nothing applied
        assert src.manifests_refused >= 3
        # The robot does hold the real key (from its authorized Fetch at the relay).
        assert src._key == relay.fanout_key(RUN)
        assert relay.fanout_key(RUN) != relay.fanout_key("run-other")
    finally:
        src.close()
        client.close()
        rogue.close(0)
        ctx.term()
        relay.stop()


def test_a_robot_follows_its_relay_through_a_restart(cloud: Cloud) -> None:
    # A restarted relay has a new fan-out key and follows no run until a robot asks for it:
    # the robot, hearing no authentic manifest, registers again and gets the next version.
    relay = SiteRelay(cloud.settings, cloud_address=cloud.address, port=0, zmq_port=0)
    port, zmq_port = relay.start()
    robot = cloud.robot("arm-0")
    client = EdgeClient(
        make_channel(relay.address, cloud.settings), robot.credential, cloud.settings
    )
    rx = WeightReceiver()
    source = ZmqWeightSubscription(client, relay.zmq_address, RUN, rx)
    pub = cloud.server.distributor(RUN)
    state = {"w": np.zeros(10_000, np.float32)}
    try:
        pub.publish(state)
        assert rx.wait_for(0, 30)
        relay.stop()
        relay = SiteRelay(cloud.settings, cloud_address=cloud.address, port=port, zmq_port=zmq_port)
        assert relay.start() == (port, zmq_port)
        state["w"][:10] = 1.0
        pub.publish(state)
        assert rx.wait_for(1, 60), f"registrations {source.registrations}"
        np.testing.assert_array_equal(rx.current()[1]["w"], state["w"])
        assert source.registrations >= 2
    finally:
        source.close()
        client.close()
        relay.stop()


def test_a_robot_waits_longer_each_time_its_relay_still_holds_no_version(
    cloud: Cloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before a run's first version the relay is silent; the robot's registrations back off
    # (here from 0.3 s to at most 1.2 s: 0.3, 0.6, 1.2, 1.2, ...) instead of coming every 0.3 s,
    # and the first version is still applied.
    monkeypatch.setattr(zmq_subscription, "REGISTER_AGAIN_S", 0.3)
    monkeypatch.setattr(zmq_subscription, "REGISTER_AGAIN_MAX_S", 1.2)
    relay = SiteRelay(cloud.settings, cloud_address=cloud.address, port=0, zmq_port=0)
    relay.start()
    robot = cloud.robot("arm-0")
    client = EdgeClient(
        make_channel(relay.address, cloud.settings), robot.credential, cloud.settings
    )
    rx = WeightReceiver()
    source = ZmqWeightSubscription(client, relay.zmq_address, RUN, rx)
    try:
        time.sleep(6.0)
        # every 0.3 s would be about 20; backing off: about 1 + 0.3, 0.9, 2.1, then every 1.2
        assert 3 <= source.registrations <= 8, source.registrations
        cloud.server.distributor(RUN).publish({"w": np.ones(1_000, np.float32)})
        assert rx.wait_for(0, 30), f"registrations {source.registrations}"
        assert source._register_after == 0.3  # a manifest heard: a silence counts as at first
    finally:
        source.close()
        client.close()
        relay.stop()
