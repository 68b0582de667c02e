"""Weight distribution: encoding, delta choice, >4 MB versions, corrupted and truncated streams,
latest-only memory, atomic apply."""

from __future__ import annotations

import threading
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

import grpc
import grpc.aio
import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch
import torch

from comms.cloud.distributor import WeightDistributor
from comms.cloud.loop_thread import LoopThread
from comms.proto import robofleet_pb2 as pb
from comms.proto import robofleet_pb2_grpc as rpc
from comms.robot.client import make_channel
from comms.robot.grpc_subscription import GrpcWeightSubscription
from comms.robot.receiver import VersionAssembler, WeightReceiver
from comms.wire import tensors as T
from comms.wire import weight_codec as W
from tests.fakes.cloud import RUN, Cloud


def model(seed: int, n: int = 50_000) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "encoder.weight": rng.standard_normal((n // 100, 100)).astype(np.float32),
        "encoder.bias": rng.standard_normal(100).astype(np.float32),
        "head.weight": rng.standard_normal((7, 100)).astype(np.float16),
        "steps": np.array([seed], dtype=np.int64),
    }


def assemble(enc: W.EncodedVersion) -> VersionAssembler:
    asm = VersionAssembler(enc.manifest)
    for i in range(enc.num_chunks):
        assert asm.add(enc.chunk_message(i).chunk)
    return asm


def test_full_payload_is_a_safetensors_file_and_chunks_are_at_most_1mib() -> None:
    state = model(0, n=600_000)  # 2.4 MB
    enc = W.encode_full(RUN, W.Snapshot.take(state, 0))
    loaded = safetensors.numpy.load(bytes(enc.payload))
    assert loaded.keys() == state.keys()
    for k in state:
        np.testing.assert_array_equal(loaded[k], state[k])
    assert enc.num_chunks == 3
    assert all(len(enc.chunk(i)) <= 1024 * 1024 for i in range(enc.num_chunks))


def test_a_large_blob_copied_by_two_threads_is_a_safetensors_file_byte_for_byte() -> None:
    # Over 8 MiB the copy is cut in two halves of the bytes, the cut inside a tensor here;
    # every tensor, the cut one and empty ones too, must land whole and in place.
    rng = np.random.default_rng(3)
    state: dict[str, Any] = {
        "a": rng.standard_normal(1_500_001).astype(np.float32),
        "empty": np.zeros((0, 4), np.float32),
        "b": rng.integers(0, 255, 3_000_003, dtype=np.uint8),
        "c": rng.standard_normal((700, 1001)).astype(np.float64),
        "d": torch.randn(999, 3).to(torch.bfloat16),
    }
    blob = bytes(T.encode(state))
    assert len(blob) > 8 << 20
    loaded = safetensors.torch.load(blob)
    assert loaded.keys() == state.keys()
    for k in ("a", "empty", "b", "c"):
        np.testing.assert_array_equal(loaded[k].numpy(), state[k])
    assert loaded["d"].dtype == torch.bfloat16 and torch.equal(loaded["d"], state["d"])


def test_delta_sends_sparse_elements_or_whole_tensors_by_size() -> None:
    base = model(1)
    new = {k: v.copy() for k, v in base.items()}
    new["encoder.weight"][3, :10] += 1.0  # 10 of 50k elements: sparse
    new["encoder.bias"][:] -= 1.0  # every element: whole tensor
    b, n = W.Snapshot.take(base, 0), W.Snapshot.take(new, 1)
    delta = W.encode_delta(RUN, b, n)
    assert delta is not None and delta.base_version == 0
    enc = {e.name: e.encoding for e in delta.manifest.tensors if e.name in delta.manifest.changed}
    assert enc == {"encoder.weight": pb.TensorEntry.SPARSE, "encoder.bias": pb.TensorEntry.FULL}
    # 10 changed elements x (int32 index + float32 value) + the 100-float bias, plus the header.
    data_bytes = 10 * (4 + 4) + 100 * 4
    assert data_bytes <= len(delta.payload) < data_bytes + 512
    out = W.apply(delta.manifest, assemble(delta).payload, b.arrays)
    for k in new:
        np.testing.assert_array_equal(out[k][1], new[k])
    assert out["head.weight"][1] is b.arrays["head.weight"][1]  # unchanged: shared, not copied


def test_delta_larger_than_full_is_not_used_and_nan_bits_compare_equal() -> None:
    base = model(2)
    base["encoder.bias"][0] = np.nan
    same = {k: v.copy() for k, v in base.items()}
    d = W.encode_delta(RUN, W.Snapshot.take(base, 0), W.Snapshot.take(same, 1))
    assert d is not None and list(d.manifest.changed) == []
    assert W.encode_delta(RUN, W.Snapshot.take(base, 0), W.Snapshot.take(model(3), 1)) is None


def test_receiver_refuses_delta_onto_wrong_base_and_manifest_lies() -> None:
    s0, s1 = W.Snapshot.take(model(4), 0), W.Snapshot.take(model(5), 1)
    rx = WeightReceiver()
    assert rx.apply(assemble(W.encode_full(RUN, s0)))
    changed = {k: v.copy() for k, v in model(5).items()}
    changed["steps"][0] = 99
    delta = W.encode_delta(RUN, s1, W.Snapshot.take(changed, 2))
    assert delta is not None and not rx.wants(delta.manifest)
    assert not rx.apply(assemble(delta)) and rx.version == 0
    bad = pb.Manifest()
    bad.CopyFrom(W.encode_full(RUN, s1).manifest)
    bad.chunk_bytes = 2 * 1024 * 1024
    with pytest.raises(W.WeightFormatError, match="chunk_bytes"):
        VersionAssembler(bad)


def test_bfloat16_torch_tensors_round_trip() -> None:
    state = {"w": torch.randn(33, 7).to(torch.bfloat16), "b": torch.arange(5, dtype=torch.int32)}
    rx = WeightReceiver(as_torch=True)
    assert rx.apply(assemble(W.encode_full(RUN, W.Snapshot.take(state, 0))))
    _, got = rx.current()
    assert got["w"].dtype == torch.bfloat16 and torch.equal(got["w"], state["w"])
    assert torch.equal(got["b"], state["b"])


def test_version_over_4mb_reaches_a_subscriber_and_deltas_follow(cloud: Cloud) -> None:
    robot = cloud.robot("arm-1")
    client = cloud.client(robot)
    rx = WeightReceiver()
    src = GrpcWeightSubscription(client, RUN, rx)
    pub = cloud.server.distributor(RUN)
    state = model(6, n=3_000_000)  # 12 MB of float32
    pub.publish(state)
    assert rx.wait_for(0, 20)
    state["encoder.weight"][0, 0] = 42.0
    pub.publish(state)
    assert rx.wait_for(1, 20)
    version, got = rx.current()
    assert version == 1
    for k in state:
        np.testing.assert_array_equal(got[k], state[k])
    assert pub.latest().delta is not None  # type: ignore[union-attr]
    assert src.bytes_received < 13_000_000  # the second version came as a small delta
    src.close()
    client.close()


def auth_only(context: grpc.aio.ServicerContext) -> tuple[tuple[str, str], ...]:
    return tuple((k, v) for k, v in context.invocation_metadata() or () if k == "authorization")


class FaultyWeights(rpc.WeightsServicer):
    """A gRPC hop in front of the real server that corrupts or truncates its first stream."""

    def __init__(self, upstream: str, mode: str) -> None:
        self.upstream = upstream
        self.stub: rpc.WeightsStub | None = None
        self.mode = mode
        self.subscribes = 0
        self.fetches: list[list[int]] = []

    async def Subscribe(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:  # type: ignore[override]
        self.subscribes += 1
        first = self.subscribes == 1
        assert self.stub is not None
        async for msg in self.stub.Subscribe(request_iterator, metadata=auth_only(context)):
            if first and msg.HasField("chunk") and msg.chunk.index == 2:
                if self.mode == "truncate":
                    return  # the stream ends mid-version
                data = bytearray(msg.chunk.data)
                data[100] ^= 0xFF
                msg.chunk.data = bytes(data)
            await context.write(msg)

    async def Fetch(self, request: pb.FetchRequest, context: grpc.aio.ServicerContext) -> None:  # type: ignore[override]
        self.fetches.append(list(request.indices))
        if self.mode == "truncate":
            await context.abort(grpc.StatusCode.UNAVAILABLE, "fetch path down too")
        assert self.stub is not None
        async for msg in self.stub.Fetch(request, metadata=auth_only(context)):
            await context.write(msg)


def proxy(upstream: str, mode: str) -> Iterator[tuple[str, FaultyWeights]]:
    loop = LoopThread("proxy")
    servicer = FaultyWeights(upstream, mode)

    async def start() -> tuple[grpc.aio.Server, int]:
        servicer.stub = rpc.WeightsStub(grpc.aio.insecure_channel(upstream))  # on this loop
        server = grpc.aio.server()
        rpc.add_WeightsServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, port

    server, port = loop.run(start())
    yield f"127.0.0.1:{port}", servicer
    loop.run(server.stop(0))
    loop.stop()


def test_corrupted_chunk_is_refused_and_fetched_again(cloud: Cloud) -> None:
    from comms.robot.client import EdgeClient

    robot = cloud.robot("arm-1")
    pub = cloud.server.distributor(RUN)
    state = model(7, n=1_000_000)  # 4 MB: 4 chunks
    pub.publish(state)
    assert pub.flush(10)
    gen = proxy(cloud.address, "corrupt")
    address, faulty = next(gen)
    # The fault is injected on the gRPC stream: its chunks must travel there.
    grpc_only = cloud.settings.model_copy(update={"data_plane": False})
    client = EdgeClient(make_channel(address, grpc_only), robot.credential, grpc_only)
    rx = WeightReceiver()
    src = GrpcWeightSubscription(client, RUN, rx)
    try:
        assert rx.wait_for(0, 20)
        assert src.chunks_refused == 1 and faulty.fetches == [[2]]
        np.testing.assert_array_equal(rx.current()[1]["encoder.weight"], state["encoder.weight"])
    finally:
        src.close()
        client.close()
        next(gen, None)


def test_truncated_stream_is_never_applied(cloud: Cloud) -> None:
    from comms.robot.client import EdgeClient

    robot = cloud.robot("arm-1")
    pub = cloud.server.distributor(RUN)
    state = model(8, n=1_000_000)
    pub.publish(state)
    assert pub.flush(10)
    gen = proxy(cloud.address, "truncate")
    address, faulty = next(gen)
    # The fault is injected on the gRPC stream: its chunks must travel there.
    grpc_only = cloud.settings.model_copy(update={"data_plane": False})
    client = EdgeClient(make_channel(address, grpc_only), robot.credential, grpc_only)
    applied: list[int] = []
    rx = WeightReceiver(on_applied=applied.append)
    src = GrpcWeightSubscription(client, RUN, rx)
    try:
        # The first stream ends after 2 of 4 chunks and Fetch fails: nothing may be applied.
        deadline = time.monotonic() + 10
        while faulty.subscribes < 2 and time.monotonic() < deadline:
            assert rx.version == -1
            time.sleep(0.01)
        assert faulty.fetches, "the receiver tried to complete the version"
        assert rx.wait_for(0, 20)  # the next, whole stream is applied
        assert applied == [0]
        np.testing.assert_array_equal(rx.current()[1]["encoder.weight"], state["encoder.weight"])
    finally:
        src.close()
        client.close()
        next(gen, None)


def test_latest_only_memory_is_flat_for_fast_publishing_and_slow_subscriber(cloud: Cloud) -> None:
    robot = cloud.robot("arm-1")
    client = cloud.client(robot)
    pub = cloud.server.distributor(RUN)
    rx = WeightReceiver()
    published = threading.Event()
    orig_apply = rx.apply
    applied: list[int] = []

    def slow_apply(asm: VersionAssembler) -> bool:
        # A robot stuck applying its first version while all 300 are published (and encoded).
        assert published.wait(60), "publishing never finished"
        ok = orig_apply(asm)
        applied.append(asm.key[0])
        return ok

    rx.apply = slow_apply  # type: ignore[method-assign]
    src = GrpcWeightSubscription(client, RUN, rx)
    tracemalloc.start()
    try:
        state = model(9, n=500_000)  # 2 MB a version
        version_bytes = sum(a.nbytes for a in state.values())
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        for v in range(300):
            state["steps"][0] = v
            state["encoder.weight"][v % 5000, v % 100] += 1
            pub.publish(state)
        assert pub.flush(20)
        last = pub.latest()
        assert last is not None
        published.set()
        assert rx.wait_for(last.version, 30)
        _, peak = tracemalloc.get_traced_memory()
        # Held at once: latest, delta base, a pending snapshot, what streams and the robot hold;
        # 300 versions were published (600 MB had they been queued).
        assert peak - base < 10 * version_bytes, f"peak {peak - base} bytes"
        # Flow control: the version in flight when the robot stalled, then straight the newest.
        assert applied[-1] == last.version and len(applied) <= 2, applied
        assert src.versions_applied == len(applied)
        np.testing.assert_array_equal(rx.current()[1]["encoder.weight"], state["encoder.weight"])
    finally:
        tracemalloc.stop()
        published.set()
        src.close()
        client.close()


def test_a_version_held_already_is_acknowledged_and_the_stream_goes_on(cloud: Cloud) -> None:
    """A subscriber that skips a version (held already) must still ack it, or nothing newer
    would ever be sent (the window is one version)."""
    robot = cloud.robot("arm-1")
    client = cloud.client(robot)
    pub = cloud.server.distributor(RUN)
    rx = WeightReceiver()
    orig_wants = rx.wants
    refused: list[int] = []

    def wants(manifest: pb.Manifest) -> bool:
        if manifest.version == 1:
            refused.append(1)
            return False
        return orig_wants(manifest)

    rx.wants = wants  # type: ignore[method-assign]
    state = model(3, n=10_000)
    pub.publish(state, version=1)
    assert pub.flush(10)
    src = GrpcWeightSubscription(client, RUN, rx)
    try:
        deadline = time.monotonic() + 10
        while not refused and time.monotonic() < deadline:
            time.sleep(0.05)
        assert refused == [1] and rx.version == -1
        state["steps"][0] = 2
        pub.publish(state, version=2)
        assert rx.wait_for(2, 15), "the version after a skipped one never came"
        assert refused == [1], "a skipped version was sent again"
    finally:
        src.close()
        client.close()


def test_reader_polling_during_apply_only_sees_whole_versions() -> None:
    pub = WeightDistributor(RUN, chunk_bytes=64 * 1024)
    rx = WeightReceiver()
    stop = threading.Event()
    seen: list[tuple[int, bool]] = []

    def reader() -> None:
        while not stop.is_set():
            version, state = rx.current()
            if version < 0:
                continue
            # Every tensor of version v is filled with v: a mix would mean a half-applied model.
            whole = all(
                bool((a == a.flat[0]).all()) and int(a.flat[0]) == version for a in state.values()
            )
            seen.append((version, whole))

    t = threading.Thread(target=reader)
    t.start()
    try:
        have = -1
        for v in range(40):
            state = {f"layer{i}": np.full((200, 100), v, dtype=np.float32) for i in range(8)}
            if v % 3 == 0:
                state["layer0"][:] = v  # every third version changes all, others all too
            pub.publish(state, version=v)
            assert pub.flush(10)
            enc = pub.latest().for_subscriber(have)  # type: ignore[union-attr]
            assert rx.apply(assemble(enc))
            have = v
    finally:
        stop.set()
        t.join()
        pub.close()
    versions = {v for v, _ in seen}
    assert len(versions) > 5 and all(whole for _, whole in seen)


def test_concurrent_first_use_of_a_runs_distributor_creates_one(cloud: Cloud) -> None:
    """Subscribers (event loop) and the run driver (its thread) may ask for a run's
    distributor at the same moment; a second one would leave subscribers waiting on a lost
    one."""
    import threading

    barrier = threading.Barrier(16)
    got: list[object] = []

    def ask() -> None:
        barrier.wait()
        got.append(cloud.server.state.distributor("run-race"))

    threads = [threading.Thread(target=ask) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(got) == 16 and len({id(p) for p in got}) == 1


def test_async_checked_chunks_refuse_corruption_and_never_overwrite_verified_data() -> None:
    enc = W.encode_full(RUN, W.Snapshot.take(model(0, n=600_000), 0), chunk_bytes=256 * 1024)
    asm = VersionAssembler(enc.manifest)
    bad = enc.chunk_message(1).chunk
    bad.data = b"\x00" + bad.data[1:]
    for i in range(enc.num_chunks):
        asm.add_async(bad if i == 1 else enc.chunk_message(i).chunk)
    assert not asm.complete and asm.missing == [1] and asm.rejected == 1
    assert asm.add(enc.chunk_message(1).chunk)  # re-fetched
    asm.add_async(bad)  # a late duplicate of a verified chunk is ignored
    assert asm.complete and asm.rejected == 1
    assert bytes(asm.payload) == bytes(enc.payload)
    wrong_size = enc.chunk_message(0).chunk
    wrong_size.data = wrong_size.data[:-1]
    other = VersionAssembler(enc.manifest)
    other.add_async(wrong_size)
    assert other.rejected == 1 and 0 in other.missing


def test_chunks_are_bound_by_blake3_and_an_older_sha256_manifest_still_verifies() -> None:
    import hashlib

    import blake3

    enc = W.encode_full(RUN, W.Snapshot.take(model(0, n=300_000), 0), chunk_bytes=256 * 1024)
    m = enc.manifest
    assert not m.chunk_sha256 and len(m.chunk_blake3) == enc.num_chunks > 1
    assert m.chunk_blake3[1] == blake3.blake3(enc.chunk(1)).digest()
    old = pb.Manifest()
    old.CopyFrom(m)
    old.ClearField("chunk_blake3")
    old.chunk_sha256.extend(hashlib.sha256(enc.chunk(i)).digest() for i in range(enc.num_chunks))
    asm = VersionAssembler(old)
    bad = enc.chunk_message(1).chunk
    bad.data = b"\x00" + bad.data[1:]
    for i in range(enc.num_chunks):
        asm.add_async(bad if i == 1 else enc.chunk_message(i).chunk)
    assert asm.missing == [1] and asm.rejected == 1  # checked with SHA-256
    assert asm.add(enc.chunk_message(1).chunk) and asm.complete
    both = pb.Manifest()
    both.CopyFrom(m)
    both.chunk_sha256.extend(old.chunk_sha256)
    with pytest.raises(W.WeightFormatError, match="both"):
        W.check_manifest(both)


def test_a_weight_buffer_is_reused_only_once_nothing_reads_it() -> None:
    import gc

    def address(buf: memoryview) -> int:
        return int(np.frombuffer(buf, np.uint8).ctypes.data)

    size = T.POOL_MIN_BYTES * 3 + 7
    first = T.byte_buffer(size)
    where = address(first)
    tensor = torch.from_numpy(np.frombuffer(first, np.uint8))  # a reader of its bytes
    del first
    gc.collect()
    second = T.byte_buffer(size)
    assert address(second) != where  # the tensor still reads the first buffer
    del tensor
    gc.collect()
    assert address(T.byte_buffer(size)) == where  # recycled once nothing reads it
    assert len(T.byte_buffer(100)) == 100  # small ones are not pooled


def test_the_pool_keeps_a_sizes_working_set_and_nothing_of_sizes_seen_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import gc

    def address(buf: memoryview) -> int:
        return int(np.frombuffer(buf, np.uint8).ctypes.data)

    size = T.POOL_MIN_BYTES + 5
    pool = T._BufferPool(max_bytes=8 * size)
    held = [pool.take(size) for _ in range(5)]  # five receivers of one process at once
    where = {address(b) for b in held}
    del held
    gc.collect()
    assert pool.free_bytes == 5 * size  # the working set stays mapped, past POOL_PER_SIZE
    again = [pool.take(size) for _ in range(6)]
    assert {address(b) for b in again[:5]} == where and pool.free_bytes == 0
    del again
    gc.collect()
    assert pool.free_bytes == 6 * size  # the peak is now six
    once = pool.take(3 * size)  # a size handed out once (a delta's) is not kept
    del once
    gc.collect()
    assert pool.free_bytes == 6 * size
    twice = [pool.take(3 * size) for _ in range(2)]  # recurs, but past the cap of 8 sizes
    del twice
    gc.collect()
    assert pool.free_bytes == 6 * size
    roomy = T._BufferPool(max_bytes=8 * size)
    twice = [roomy.take(3 * size) for _ in range(2)]
    del twice
    gc.collect()
    assert roomy.free_bytes == 6 * size  # the same two buffers kept where they fit
    # A long run's deltas (a new size each) leave no counts behind past a bound.
    monkeypatch.setattr(T, "_POOL_SIZES_COUNTED", 4)
    for k in range(20):
        b = roomy.take(size + 100 + k)
        del b
        gc.collect()
    assert len(roomy._takes) <= 5 and roomy._takes[3 * size] == 2
    assert roomy.free_bytes == 6 * size


def test_a_delta_is_copied_into_the_buffer_the_version_before_freed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A robot applying a delta writes the updated tensors into the full-size buffer its
    previous version gave back to the pool, not into new memory beside it."""
    import gc

    pool = T._BufferPool(max_bytes=1 << 30)
    monkeypatch.setattr(T, "_POOL", pool)
    n = 400_000  # 1.6 MB a version: pooled
    new = model(21, n)
    new["encoder.weight"][0, :5] += 1.0
    new["head.weight"][0, 0] += 1.0
    s0, s1 = W.Snapshot.take(model(20, n), 0), W.Snapshot.take(model(21, n), 1)
    s2 = W.Snapshot.take(new, 2)
    full0, full1 = W.encode_full(RUN, s0), W.encode_full(RUN, s1)
    delta = W.encode_delta(RUN, s1, s2)
    assert delta is not None and len(delta.payload) < T.POOL_MIN_BYTES
    rx = WeightReceiver()
    assert rx.apply(assemble(full0)) and rx.apply(assemble(full1))
    gc.collect()
    size = len(full1.payload)
    assert pool.free_bytes == size  # version 0's buffer, kept for the next version
    _, before = rx.current_arrays()
    assert rx.apply(assemble(delta))
    assert pool.free_bytes == 0  # the delta's copies took it
    _, after = rx.current_arrays()
    for k in new:
        np.testing.assert_array_equal(after[k][1], new[k])
    assert after["encoder.bias"][1] is before["encoder.bias"][1]  # unchanged: still shared


def test_a_whole_versions_receiver_holds_each_delta_as_its_full_payload() -> None:
    """What a relay republishes: a delta applied into one buffer that is, byte for byte, the
    full version's payload, every tensor a view of it (unchanged and whole-tensor ones too)."""
    base = model(30)
    new = {k: v.copy() for k, v in base.items()}
    new["encoder.weight"][3, :10] += 1.0  # sparse
    new["encoder.bias"][:] -= 1.0  # whole tensor
    s0, s1 = W.Snapshot.take(base, 0), W.Snapshot.take(new, 1)
    delta = W.encode_delta(RUN, s0, s1)
    assert delta is not None
    rx = WeightReceiver(whole_versions=True)
    assert rx.apply(assemble(W.encode_full(RUN, s0)))
    got = rx.current_payload()
    assert got is not None and got[0] == 0 and bytes(got[2]) == bytes(s0.payload)
    assert rx.apply(assemble(delta))
    got = rx.current_payload()
    assert got is not None and got[0] == 1
    assert bytes(got[2]) == bytes(W.encode_full(RUN, s1).payload)
    blob = np.frombuffer(got[2], np.uint8)
    _, arrays = rx.current_arrays()
    for k in new:
        np.testing.assert_array_equal(arrays[k][1], new[k])
        assert np.shares_memory(arrays[k][1], blob), k
    assert WeightReceiver().current_payload() is None


def test_each_chunk_is_handed_on_once_its_digest_checked_and_a_bad_one_never() -> None:
    """What a site relay forwards before the version is complete (cut-through)."""
    enc = W.encode_full(RUN, W.Snapshot.take(model(0, n=300_000), 0), chunk_bytes=256 * 1024)
    seen: dict[int, bytes] = {}
    lock = threading.Lock()

    def verified(i: int, data: memoryview) -> None:
        with lock:
            seen[i] = bytes(data)

    asm = VersionAssembler(enc.manifest, on_verified=verified)
    bad = enc.chunk_message(2).chunk
    bad.data = b"\x00" + bad.data[1:]
    for i in range(enc.num_chunks):
        asm.add_async(bad if i == 2 else enc.chunk_message(i).chunk)
    assert asm.missing == [2]
    good = [i for i in range(enc.num_chunks) if i != 2]
    deadline = time.monotonic() + 10  # a check's callback runs just after its result is set
    while len(seen) < len(good) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert 2 not in seen and sorted(seen) == good
    assert asm.add(enc.chunk_message(2).chunk)  # a re-fetched chunk is handed on too
    assert all(seen[i] == enc.chunk(i) for i in range(enc.num_chunks))


def test_bf16_delta_and_republish_keep_the_dtype() -> None:
    """A BF16 tensor (held as uint16 bits) travels in deltas as BF16, and a relay-style
    republish of typed arrays keeps it BF16 (it used to fail: uint16 has no safetensors name)."""
    import torch

    from comms.robot.receiver import WeightReceiver

    w = torch.randn(50_000).to(torch.bfloat16)
    base = W.Snapshot.take({"w": w}, 0)
    w2 = w.clone()
    w2[:10] += 1
    new = W.Snapshot.take({"w": w2}, 1)
    delta = W.encode_delta(RUN, base, new)
    assert delta is not None and delta.manifest.tensors[0].dtype == "BF16"
    out = W.apply(delta.manifest, bytearray(delta.payload), base.arrays)
    assert out["w"][0] == "BF16"
    assert torch.equal(torch.from_numpy(out["w"][1].copy()).view(torch.bfloat16), w2)
    rx = WeightReceiver()
    assert rx.apply(assemble(W.encode_full(RUN, new)))
    version, arrays = rx.current_arrays()
    again = W.Snapshot.take(arrays, version)  # what the relay republishes
    assert again.arrays["w"][0] == "BF16" and bytes(again.payload) == bytes(new.payload)


def test_publish_safetensors_refuses_bytes_that_are_not_safetensors() -> None:
    dist = WeightDistributor("run-1")
    try:
        with pytest.raises(T.TensorFormatError):
            dist.publish_safetensors(bytearray(b"\x00" * 4))
        with pytest.raises(ValueError, match="not above"):
            dist.publish_safetensors(T.encode({"a": np.zeros(3, np.float32)}), version=0)
            dist.publish_safetensors(T.encode({"a": np.zeros(3, np.float32)}), version=0)
    finally:
        dist.close()


def test_flush_waits_for_the_version_being_encoded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: flush returned while the encoder thread held a snapshot it had taken off
    the queue but not yet stored (``latest()`` was still None)."""
    import comms.cloud.distributor as distributor_mod

    real_encode = distributor_mod.W.encode_full
    started = threading.Event()

    def slow_encode(*args: object, **kwargs: object) -> object:
        started.set()
        time.sleep(0.5)
        return real_encode(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(distributor_mod.W, "encode_full", slow_encode)
    dist = WeightDistributor("run-1")
    try:
        dist.publish({"w": torch.randn(300, 200)}, version=3)
        assert started.wait(5)  # the thread has taken the snapshot: _pending is None now
        assert dist.flush(10)
        latest = dist.latest()
        assert latest is not None and latest.version == 3
    finally:
        dist.close()
