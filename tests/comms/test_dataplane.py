"""The ZeroMQ data plane beside gRPC: weight chunks and step batches travel there, checked and
acknowledged exactly as on gRPC; forged tokens get nothing; an unreachable or failing data
plane falls back to gRPC bytes; under TLS it is CURVE-encrypted."""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import zmq

from comms.cloud.dataplane import DataPlaneServer
from comms.cloud.step_sink import MemorySink
from comms.proto import robofleet_pb2 as pb
from comms.robot import dataplane_client
from comms.robot.client import EdgeClient, make_channel
from comms.robot.grpc_subscription import GrpcWeightSubscription
from comms.robot.receiver import WeightReceiver
from comms.robot.uploader import MemorySpool, Uploader
from comms.wire import steps as S
from comms.wire.dataplane_frames import BATCH, BATCH_HEADER, HELLO, NO, OK
from comms.wire.weight_codec import EncodedVersion
from foundation.store.metadata_store import MetadataStore
from tests.comms.helpers import rpc_code, self_signed_cert, steps
from tests.fakes.cloud import RUN, Cloud
from tests.fakes.settings import fast_comms


def _model(seed: int, n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal(n).astype(np.float32), "b": np.zeros(7, np.float32)}


def _dp(cloud: Cloud) -> DataPlaneServer:
    dp = cloud.server.state.dataplane
    assert dp is not None, "the server offers no data plane"
    return dp


def test_weights_travel_on_the_data_plane_and_are_checked_against_the_manifest(
    cloud: Cloud,
) -> None:
    robot = cloud.robot("arm-1")
    client = cloud.client(robot)
    rx = WeightReceiver()
    src = GrpcWeightSubscription(client, RUN, rx)
    pub = cloud.server.distributor(RUN)
    try:
        state = _model(1, 3_000_000)  # 12 MB: 12 chunks
        pub.publish(state)
        assert rx.wait_for(0, 20)
        payload = pub.latest().full.manifest.payload_bytes  # type: ignore[union-attr]
        assert src.data_plane_bytes == src.bytes_received == payload
        assert _dp(cloud).weight_bytes_sent == payload
        state["w"][:10] += 1.0
        pub.publish(state)
        assert rx.wait_for(1, 20)  # the delta, on the data plane as well
        assert src.data_plane_bytes == src.bytes_received < payload + 1000
        for k, v in state.items():
            np.testing.assert_array_equal(rx.current()[1][k], v)
        assert src.chunks_refused == 0 and src.refetches == 0
    finally:
        src.close()
        client.close()


def test_uploads_travel_on_the_data_plane_whole_and_are_stored_exactly_once(
    cloud: Cloud,
) -> None:
    robot = cloud.robot("arm-1")
    client = cloud.client(robot)
    spool = MemorySpool()
    up = Uploader(client, RUN, spool)
    try:
        for i in range(20):
            spool.put(steps(robot.robot_id, i * 5, 5))
        big = steps(robot.robot_id, 100, 6, payload_bytes=1_000_000)  # 6 MB, one frame
        spool.put(big)
        assert up.wait_durable(105, 20), up.last_error
        assert cloud.sink.seqs(robot.robot_id) == list(range(106))
        assert cloud.sink.batches[-1][1].equals(big)
        assert up.data_plane_batches == 21
        assert _dp(cloud).batches_received == 21
        assert len(spool) == 0
    finally:
        up.close()
        client.close()


def test_upload_on_the_data_plane_resumes_after_a_server_restart_without_duplicates(
    store: MetadataStore,
) -> None:
    cloud = Cloud(store, MemorySink())
    sink = cloud.sink
    robot = cloud.robot("arm-1")
    client = cloud.client(robot)
    spool = MemorySpool()
    up = Uploader(client, RUN, spool)
    try:
        spool.put(steps(robot.robot_id, 0, 10))
        assert up.wait_durable(9, 10)
        cloud.stop()
        spool.put(steps(robot.robot_id, 10, 10))  # spooled while the cloud is away
        cloud.start()  # on the same port, with the same sink
        spool.put(steps(robot.robot_id, 20, 10))
        assert up.wait_durable(29, 20), up.last_error
        assert sink.seqs(robot.robot_id) == list(range(30))
        assert up.data_plane_batches >= 3 and up.reconnects >= 1
    finally:
        up.close()
        client.close()
        cloud.close()


def test_unreachable_data_plane_falls_back_to_grpc_bytes(store: MetadataStore) -> None:
    # Offers name 127.0.0.2, where nothing listens: every handshake times out.
    cloud = Cloud(
        store, MemorySink(), fast_comms(data_advertise_host="127.0.0.2", data_plane_handshake_s=0.3)
    )
    sink = cloud.sink
    robot = cloud.robot("arm-1")
    client = cloud.client(robot)
    rx = WeightReceiver()
    src = GrpcWeightSubscription(client, RUN, rx)
    spool = MemorySpool()
    up = Uploader(client, RUN, spool)
    try:
        state = _model(2, 1_500_000)
        cloud.server.distributor(RUN).publish(state)
        for i in range(5):
            spool.put(steps(robot.robot_id, i * 4, 4))
        assert rx.wait_for(0, 20)
        np.testing.assert_array_equal(rx.current()[1]["w"], state["w"])
        assert src.data_plane_bytes == 0 and src.bytes_received >= 6_000_000
        assert up.wait_durable(19, 20), up.last_error
        assert sink.seqs(robot.robot_id) == list(range(20))
        assert up.data_plane_batches == 0
    finally:
        up.close()
        src.close()
        client.close()
        cloud.close()


def _offer(cloud: Cloud, credential: str, upload: bool = False) -> tuple[Any, pb.DataPlane]:
    """Open a Subscribe (or, with ``upload``, an Upload) stream asking for the data plane;
    returns ((call, its request queue, client), its offer)."""
    client = EdgeClient(make_channel(cloud.address, cloud.settings), credential, cloud.settings)
    requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
    if upload:
        requests.put(pb.StepBatch(run_id=RUN, data_plane=True))
    else:
        requests.put(pb.SubscribeRequest(run_id=RUN, have_version=-1, data_plane=True))

    def gen() -> Any:
        while (r := requests.get()) is not None:
            yield r

    method = client.experience.Upload if upload else client.weights.Subscribe
    call = method(gen(), metadata=client.metadata)
    first = next(call)
    assert first.HasField("data_plane")
    return (call, requests, client), first.data_plane


def _hello(endpoint: str, token: bytes) -> bytes | None:
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    s.send_multipart([HELLO, token])
    got = s.recv() if s.poll(2000) else None
    s.close(0)
    return got


def test_forged_or_reused_tokens_get_nothing_and_unbound_frames_are_dropped(
    cloud: Cloud,
) -> None:
    robot = cloud.robot("arm-1")
    (call, requests, client), offer = _offer(cloud, robot.credential)
    dp = _dp(cloud)
    try:
        assert _hello(offer.endpoint, b"\0" * 32) == NO  # never handed out
        assert _hello(offer.endpoint, offer.token) == OK
        assert _hello(offer.endpoint, offer.token) == NO  # single use
        # A peer that never proved a token cannot upload: its batch is dropped unread.
        ctx = zmq.Context.instance()
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(offer.endpoint)
        refused = dp.frames_refused
        s.send_multipart([BATCH, BATCH_HEADER.pack(4, 0), b"not arrow"])
        deadline = time.monotonic() + 5
        while dp.frames_refused == refused and time.monotonic() < deadline:
            time.sleep(0.01)
        s.close(0)
        assert dp.frames_refused == refused + 1
        assert dp.batches_received == 0 and cloud.sink.batches == []
    finally:
        requests.put(None)
        call.cancel()
        client.close()
    # An ended stream's token is dead.
    (call2, requests2, client2), offer2 = _offer(cloud, robot.credential)
    requests2.put(None)
    call2.cancel()
    client2.close()
    deadline = time.monotonic() + 5
    while dp.open_sessions and time.monotonic() < deadline:
        time.sleep(0.01)
    assert dp.open_sessions == 0
    assert _hello(offer2.endpoint, offer2.token) == NO


def test_corrupted_chunk_on_the_data_plane_is_refused_and_fetched_over_grpc(
    cloud: Cloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = EncodedVersion.chunk_view
    corrupted: list[int] = []

    def flip_once(self: EncodedVersion, index: int) -> memoryview:
        view = real(self, index)
        if index == 2 and not corrupted and threading.current_thread().name == "dataplane":
            corrupted.append(index)
            bad = bytearray(view)
            bad[100] ^= 0xFF
            return memoryview(bytes(bad))
        return view

    monkeypatch.setattr(EncodedVersion, "chunk_view", flip_once)
    robot = cloud.robot("arm-1")
    client = cloud.client(robot)
    rx = WeightReceiver()
    src = GrpcWeightSubscription(client, RUN, rx)
    try:
        state = _model(3, 1_000_000)  # 4 chunks
        time.sleep(0.3)  # subscribed and bound
        cloud.server.distributor(RUN).publish(state)
        assert rx.wait_for(0, 20)
        assert corrupted == [2]
        assert src.chunks_refused == 1 and src.refetches == 1
        np.testing.assert_array_equal(rx.current()[1]["w"], state["w"])
    finally:
        src.close()
        client.close()


def test_a_data_plane_that_stops_delivering_is_left_for_the_grpc_stream(
    store: MetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    cloud = Cloud(store, MemorySink(), fast_comms(data_plane_stall_s=0.3))
    robot = cloud.robot("arm-1")
    client = cloud.client(robot)
    rx = WeightReceiver()
    src = GrpcWeightSubscription(client, RUN, rx)
    pub = cloud.server.distributor(RUN)
    try:
        state = _model(4, 500_000)
        time.sleep(0.3)
        pub.publish(state)
        assert rx.wait_for(0, 20)
        on_dp = src.data_plane_bytes
        assert on_dp > 0
        # From now on the data plane swallows every chunk (a port blocked mid-run).
        monkeypatch.setattr(DataPlaneServer, "send_version", lambda *a, **k: None)
        state["w"][:] += 1.0
        pub.publish(state)
        assert rx.wait_for(1, 20)  # completed by Fetch after the stall
        assert src.refetches == 1
        state["w"][:] += 1.0
        pub.publish(state)
        assert rx.wait_for(2, 20)  # on the gRPC stream: the server was told
        assert src.refetches == 1 and src.data_plane_bytes == on_dp
        np.testing.assert_array_equal(rx.current()[1]["w"], state["w"])
    finally:
        src.close()
        client.close()
        cloud.close()


def test_under_tls_the_data_plane_is_curve_encrypted(tmp_path: Path, store: MetadataStore) -> None:
    cert, key = self_signed_cert(tmp_path)
    cloud = Cloud(
        store, MemorySink(), fast_comms(tls_cert_file=cert, tls_key_file=key, tls_ca_file=cert)
    )
    sink = cloud.sink
    dp = cloud.server.state.dataplane
    assert dp is not None and len(dp.curve_public_key) == 40
    robot = cloud.robot("arm-tls", ca=cert)
    client = cloud.client(robot)
    rx = WeightReceiver()
    src = GrpcWeightSubscription(client, RUN, rx)
    spool = MemorySpool()
    up = Uploader(client, RUN, spool)
    try:
        state = _model(5, 1_000_000)
        time.sleep(0.5)
        cloud.server.distributor(RUN).publish(state)
        spool.put(steps(robot.robot_id, 0, 8))
        assert rx.wait_for(0, 20)
        assert src.data_plane_bytes >= 4_000_000
        assert up.wait_durable(7, 20) and up.data_plane_batches == 1
        assert sink.seqs(robot.robot_id) == list(range(8))
        # A plaintext peer cannot even say hello to a CURVE server.
        token_offer = pb.DataPlane(endpoint=dp.endpoint, token=b"\1" * 32)
        assert dataplane_client.connect(token_offer, 0.5) is None
        # And a client on a TLS channel refuses a plaintext offer.
        assert dataplane_client.connect(token_offer, 0.5, require_curve=True) is None
    finally:
        up.close()
        src.close()
        client.close()
        cloud.close()


def test_uploader_on_the_data_plane_closes_promptly_when_the_server_is_gone(
    store: MetadataStore,
) -> None:
    cloud = Cloud(store, MemorySink(), fast_comms(data_plane_handshake_s=0.5))
    robot = cloud.robot("arm-1")
    client = cloud.client(robot)
    spool = MemorySpool()
    up = Uploader(client, RUN, spool)
    try:
        spool.put(steps(robot.robot_id, 0, 4))
        assert up.wait_durable(3, 10) and up.data_plane_batches == 1
        cloud.close()  # never comes back
        for i in range(1, 20):
            spool.put(steps(robot.robot_id, i * 4, 4))
        time.sleep(1.5)
        t0 = time.monotonic()
        up.close()
        assert time.monotonic() - t0 < 5
        assert up.durable_seq == 3 and len(spool) == 19  # nothing acknowledged is lost
    finally:
        client.close()


class _SlowSink(MemorySink):
    """A sink whose appends take ``delay_s`` (an fsync on a slow disk)."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s

    def append(self, robot_id: int, batch: Any) -> int:
        time.sleep(self.delay_s)
        return super().append(robot_id, batch)


def _raw_upload(cloud: Cloud, credential: str) -> tuple[Any, zmq.Socket[bytes]]:
    """An Upload stream asking for the data plane, bound to a DEALER that said hello:
    ((the call, its request queue, client), the socket). Batches sent on the socket are
    acked on the call; nothing here limits how many are in flight."""
    stream, offer = _offer(cloud, credential, upload=True)
    s: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(offer.endpoint)
    s.send_multipart([HELLO, offer.token])
    assert s.poll(5000) and s.recv() == OK
    return stream, s


def _ipc(batch: Any) -> bytes:
    return S.encode_batch(batch)


def test_a_data_plane_client_over_its_window_is_refused_and_keeps_what_was_acked(
    store: MetadataStore,
) -> None:
    # Two batches in flight allowed: the cloud queues at most 4x that while its sink works.
    cloud = Cloud(store, _SlowSink(0.05), fast_comms(upload_window=2))
    robot = cloud.robot("arm-1")
    (call, requests, client), s = _raw_upload(cloud, robot.credential)
    acked = -1
    try:
        for i in range(40):  # no waiting for acks: far over the window
            head = BATCH_HEADER.pack(i * 5 + 4, 0)
            s.send_multipart([BATCH, head, _ipc(steps(robot.robot_id, i * 5, 5))])
        with pytest.raises(grpc.RpcError) as err:
            for ack in call:
                acked = max(acked, ack.durable_seq)
        assert rpc_code(err.value) == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "more step batches in flight than the upload window" in str(err.value.details())
        stored = cloud.sink.seqs(robot.robot_id)
        assert stored == list(range(len(stored)))  # in order, no gap, nothing twice
        assert acked < len(stored)  # every acknowledged step is stored
        assert len(stored) < 200  # the flood was refused, not taken
    finally:
        s.close(0)
        requests.put(None)
        call.cancel()
        client.close()
        cloud.close()


def test_a_data_plane_batch_over_the_size_limit_is_refused_after_the_ones_before_it(
    store: MetadataStore,
) -> None:
    robot_probe = steps(1, 0, 5, payload_bytes=2000)
    limit = len(_ipc(robot_probe)) - 100  # libzmq lets through up to 4 KiB more: it reaches us
    cloud = Cloud(store, MemorySink(), fast_comms(max_upload_batch_bytes=limit))
    robot = cloud.robot("arm-1")
    (call, requests, client), s = _raw_upload(cloud, robot.credential)
    acked = -1
    try:
        s.send_multipart([BATCH, BATCH_HEADER.pack(4, 0), _ipc(steps(robot.robot_id, 0, 5))])
        big = steps(robot.robot_id, 5, 5, payload_bytes=2000)
        s.send_multipart([BATCH, BATCH_HEADER.pack(9, 0), _ipc(big)])
        with pytest.raises(grpc.RpcError) as err:
            for ack in call:
                acked = max(acked, ack.durable_seq)
        assert rpc_code(err.value) == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert f"step batch over {limit} bytes" in str(err.value.details())
        assert acked == 4 and cloud.sink.seqs(robot.robot_id) == list(range(5))
    finally:
        s.close(0)
        requests.put(None)
        call.cancel()
        client.close()
        cloud.close()
