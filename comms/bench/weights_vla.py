"""``robofleet bench weights --vla``: VLA-sized policy versions (0.5B and 1B BF16 parameters,
1 and 2 GB a version) to 1, 4 and 16 subscribers on loopback, full and delta versions,
directly and through a site relay, against LeRobot's transport for the same tensors where it
fits in memory; and a robot's peak memory while it applies a version into the model it holds.

Each case runs the real path: a cloud gRPC server with its ZeroMQ data plane (direct) or a
:class:`~comms.relay.site_relay.SiteRelay` (fan-out over ZeroMQ), enrolled robots with their
credentials, :class:`~comms.robot.grpc_subscription.GrpcWeightSubscription` or
:class:`~comms.robot.zmq_subscription.ZmqWeightSubscription`. Version 0 (full) is published to
fresh subscribers and timed; once every one holds it, 1 % of the elements of every tensor
change and version 1 is published and timed: the distributor sends it as a delta (sparse
indices + values) when that is smaller, which it is here.

A subscriber is either ``held``: a :class:`~comms.robot.receiver.WeightReceiver` that stages,
verifies and applies every version (what a robot runs), or ``verify-only``: a bench sink that
receives every byte through the same subscription, checks each chunk's BLAKE3 against the
manifest as it lands, counts the version as received and keeps none of it (a robot that
verifies and drops). Which one a case uses is decided by the memory the case needs
(:func:`held_fits`) and printed in its row.

The robot's memory is measured in a child process (one robot, direct): its resident set before
any version (the baseline), then the peak resident set (``VmHWM``, reset through
``/proc/self/clear_refs`` before each version) while it receives version 1 (full) into a model
that holds version 0, and version 2 (a delta) into the model holding version 1. The model is a
``torch.nn.Module`` whose parameters are the applied version's tensors
(``load_state_dict(assign=True)``). Extra copies = (peak - baseline - model bytes) / model bytes.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from comms.bench import weights as W0
from comms.proto import robofleet_pb2 as pb
from comms.robot.receiver import VersionAssembler, WeightReceiver

VLA_PARAMS = (500_000_000, 1_000_000_000)
SUBSCRIBERS = (1, 4, 16)
DELTA_FRACTION = 0.01  # of the elements of every tensor, changed in a delta version
HELD = "held"
VERIFY_ONLY = "verify-only"
_GIB = 1 << 30
_TIMEOUT_S = 900.0


class DigestOnlyAssembler(VersionAssembler):
    """A bench robot's staging that keeps nothing: each chunk's BLAKE3 is checked against the
    manifest where it arrived (a gRPC message's bytes, a ZeroMQ frame), on the same verify
    threads as a held robot's, then dropped."""

    def _staging_buffer(self, nbytes: int) -> memoryview:
        return memoryview(b"")

    def _stage(self, index: int, data: Any) -> memoryview:
        return memoryview(data)


class VerifyOnlyReceiver(WeightReceiver):
    """A bench robot that receives and verifies every version (every chunk's digest) and
    drops it: it follows the version numbers, so the cloud sends it deltas, but holds no
    tensors (16 robots of a 2 GB model in one 24 GiB machine)."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes_verified = 0

    def new_assembler(
        self,
        manifest: pb.Manifest,
        on_verified: Callable[[int, memoryview], object] | None = None,
    ) -> VersionAssembler:
        return DigestOnlyAssembler(manifest, on_verified=on_verified)

    def apply(self, asm: VersionAssembler) -> bool:
        if not asm.complete:  # waits for every chunk's digest check
            return False
        m = asm.manifest
        with self._lock:
            if not self.wants(m):
                return False
            self.bytes_verified += int(m.payload_bytes)
            self._current = (int(m.version), {})
            self._applied.notify_all()
        return True


def bf16_state(n_params: int, seed: int = 0) -> dict[str, Any]:
    """About ``n_params`` BF16 parameters in ``_WIDTH`` square layers (weights uniform in
    +-0.05, as an initialized layer's; uniform because ``randn`` of 1B elements takes 30 s)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    w = W0._WIDTH
    state: dict[str, Any] = {}
    for i in range(W0._layers(n_params)):
        state[f"layers.{i}.weight"] = torch.empty(w, w, dtype=torch.bfloat16).uniform_(
            -0.05, 0.05, generator=g
        )
        state[f"layers.{i}.bias"] = torch.empty(w, dtype=torch.bfloat16).uniform_(
            -0.05, 0.05, generator=g
        )
    return state


def perturb(state: dict[str, Any], fraction: float = DELTA_FRACTION, seed: int = 1) -> int:
    """Add 0.01 to ``fraction`` of the elements of every tensor, in place (indices drawn with
    replacement: a few fall twice); returns the number of elements drawn."""
    import torch

    g = torch.Generator().manual_seed(seed)
    drawn = 0
    with torch.no_grad():
        for v in state.values():
            flat = v.view(-1)
            k = max(1, int(flat.numel() * fraction))
            idx = torch.randint(flat.numel(), (k,), generator=g)
            flat[idx] += 0.01
            drawn += k
    return drawn


def label(n_params: int) -> str:
    return f"{n_params / 1e9:.1f}B" if n_params >= 100_000_000 else f"{n_params / 1e6:.0f}M"


def model_bytes(n_params: int) -> int:
    """Bytes of the BF16 tensors of :func:`bf16_state` (``n_params`` rounded to whole layers)."""
    layers = W0._layers(n_params)
    return 2 * layers * (W0._WIDTH * W0._WIDTH + W0._WIDTH)


def held_fits(model: int, n_subs: int, relay: bool, budget: int) -> bool:
    """Whether ``n_subs`` held robots fit ``budget`` bytes beside the rest of the case.

    At the delta's publish the bench holds, in model copies: the cloud 3 (the learner's state,
    the distributor's two snapshots), a relay 2 (its version and the delta applied, which it
    republishes as it is), each held robot 2 (its version and the delta applied)."""
    return model * (3 + (2 if relay else 0) + 2 * n_subs) <= budget


def lerobot_fits(model: int, n_subs: int, budget: int) -> bool:
    """Whether LeRobot's path fits ``budget``: the state and its ``torch.save`` bytes on the
    learner, on each actor the received bytes and the ``torch.load``-ed tensors."""
    return model * (2 + 2 * n_subs) <= budget


class _Push(NamedTuple):
    t_full: float  # s from publishing version 0 until every subscriber had it
    t_delta: float  # same for version 1
    full_bytes: int  # payload of version 0
    delta_bytes: int  # payload of what version 1 was sent as
    delta_sent: bool  # whether version 1 went as a delta
    repairs: int  # what the robots fetched again, both versions (see _repairs)


def _wait_all(rxs: Sequence[WeightReceiver], version: int, timeout: float) -> bool:
    end = time.monotonic() + timeout
    return all(rx.wait_for(version, max(0.0, end - time.monotonic())) for rx in rxs)


def push(state: dict[str, Any], n_subs: int, relay: bool, mode: str) -> _Push:
    """Version 0 (full) then version 1 (1 % changed) of ``state`` to ``n_subs`` subscribers.

    ``state`` is consumed: emptied once version 1 is published (its tensors are the
    distributor's snapshot from then on), so the case holds one copy less while it streams.

    Raises:
        AssertionError: a subscriber did not get a version within 15 minutes.
    """
    from comms.bench.common import RUN, start_cloud
    from comms.relay.site_relay import SiteRelay
    from comms.robot.client import EdgeClient, make_channel
    from comms.robot.grpc_subscription import GrpcWeightSubscription
    from comms.robot.zmq_subscription import ZmqWeightSubscription

    cloud = start_cloud()
    site: SiteRelay | None = None
    srcs: list[Any] = []
    clients: list[EdgeClient] = []
    try:
        robots = cloud.robots(n_subs)
        rxs: list[WeightReceiver] = [
            WeightReceiver(as_torch=True) if mode == HELD else VerifyOnlyReceiver() for _ in robots
        ]
        if relay:
            site = SiteRelay(cloud.settings, cloud_address=cloud.server.address, port=0, zmq_port=0)
            site.start()
            clients = [
                EdgeClient(make_channel(site.address, cloud.settings), c, cloud.settings)
                for _, c in robots
            ]
            srcs = [
                ZmqWeightSubscription(c, site.zmq_address, RUN, rx)
                for c, rx in zip(clients, rxs, strict=True)
            ]
        else:
            clients = [cloud.client(c) for _, c in robots]
            srcs = [GrpcWeightSubscription(c, RUN, rx) for c, rx in zip(clients, rxs, strict=True)]
        pub = cloud.server.distributor(RUN)
        time.sleep(1.0 if relay else 0.5)  # subscriptions open (and the relay's upstream)
        t0 = time.perf_counter()
        pub.publish(state, version=0)
        assert _wait_all(rxs, 0, _TIMEOUT_S), "a subscriber never got version 0"
        t_full = time.perf_counter() - t0
        latest = pub.latest()
        assert latest is not None
        full_bytes = len(latest.full.payload)
        perturb(state)
        gc.collect()
        t0 = time.perf_counter()
        pub.publish(state, version=1)
        state.clear()
        assert _wait_all(rxs, 1, _TIMEOUT_S), "a subscriber never got version 1"
        t_delta = time.perf_counter() - t0
        latest = pub.latest()
        assert latest is not None and latest.version == 1
        sent = latest.for_subscriber(0)
        repairs = sum(_repairs(s) for s in srcs)
        return _Push(t_full, t_delta, full_bytes, len(sent.payload), latest.delta is sent, repairs)
    finally:
        W0._close_all([*srcs, *clients])
        if site is not None:
            site.stop()
        cloud.close()
        del srcs
        gc.collect()


def _repairs(src: Any) -> int:
    """What a subscription fetched again because chunks were lost or late: MiB fetched from
    the relay (behind a relay), or Fetch calls (direct; one per version repaired)."""
    if hasattr(src, "fetched_bytes"):
        return int(src.fetched_bytes) // (1 << 20)
    return int(src.refetches)


class VlaRow(NamedTuple):
    params: str  # "0.5B"
    subscribers: int
    relay: bool
    version: str  # "full" | "delta"
    mode: str  # HELD | VERIFY_ONLY
    ours: float  # s, best of the runs
    first: float  # s, the first run (buffers not yet recycled)
    base: float | None  # LeRobot s (the whole state: it has no delta); None: it did not fit
    sent_bytes: int  # bytes of the version as sent (the delta's payload for a delta)
    process_peak: int  # peak RSS of this process (cloud, relay, subscribers) in the case

    @property
    def ratio(self) -> float | None:
        return None if self.base is None else self.ours / self.base

    @property
    def key(self) -> str:
        via = "_relay" if self.relay else ""
        return f"{self.params}x{self.subscribers}{via}_{self.version}"


class MemoryRow(NamedTuple):
    params: str
    version: str  # "full into held" | "delta into held"
    model_bytes: int
    baseline: int  # robot RSS before any version, bytes
    peak: int  # robot peak RSS (VmHWM) while it received and applied this version, bytes
    baseline_anon: int  # the same two of its anonymous memory (RssAnon, sampled)
    peak_anon: int

    @property
    def extra_copies(self) -> float:
        return (self.peak - self.baseline - self.model_bytes) / self.model_bytes

    @property
    def extra_copies_anon(self) -> float:
        return (self.peak_anon - self.baseline_anon - self.model_bytes) / self.model_bytes


def push_rows(
    sizes: Sequence[int],
    subscribers: Sequence[int],
    budget: int,
    log: Callable[[str], None],
    repeats: int = 2,
) -> list[VlaRow]:
    """Every (size, subscribers, direct/relay) case, ``repeats`` times: full and delta (best
    and first run), and LeRobot's time (best of ``repeats``).

    The weight-buffer pool is emptied before each (size, subscribers) group, LeRobot's path
    first, and kept across the group's runs: from the second run on, the cloud, relay and
    robots reuse the buffers of the last version, as they do from one version to the next.
    """
    import torch

    rows: list[VlaRow] = []
    for n_params in sizes:
        mb = model_bytes(n_params)
        name = label(mb // 2)
        for n in subscribers:
            _release_memory()
            base: float | None = None
            if lerobot_fits(mb, n, budget):
                times = []
                for _ in range(repeats):
                    state = bf16_state(n_params)
                    times.append(W0._lerobot(state, n, keep=False, timeout_s=_TIMEOUT_S))
                    del state
                    gc.collect()
                base = min(times)
                log(f"{name} x{n} lerobot {' '.join(f'{t:.2f}s' for t in times)}")
            for relay in (False, True):
                mode = HELD if held_fits(mb, n, relay, budget) else VERIFY_ONLY
                runs: list[_Push] = []
                _reset_peak()
                for _ in range(repeats):
                    state = bf16_state(n_params)
                    assert all(v.dtype == torch.bfloat16 for v in state.values())
                    runs.append(push(state, n, relay, mode))
                    del state
                    gc.collect()
                    log(
                        f"{name} x{n} relay={relay} {mode}: full {runs[-1].t_full:.2f}s "
                        f"delta {runs[-1].t_delta:.2f}s repairs {runs[-1].repairs}"
                    )
                peak = _status_kib("VmHWM") * 1024
                p = runs[0]
                full = min(r.t_full for r in runs)
                rows.append(
                    VlaRow(name, n, relay, "full", mode, full, p.t_full, base, p.full_bytes, peak)
                )
                version = "delta" if all(r.delta_sent for r in runs) else "full (delta not smaller)"
                delta = min(r.t_delta for r in runs)
                rows.append(
                    VlaRow(
                        name, n, relay, version, mode, delta, p.t_delta, base, p.delta_bytes, peak
                    )
                )
    _release_memory()
    return rows


def _release_memory() -> None:
    """Free what the last cases left: the weight-buffer pool's buffers and the heap pages the
    cloud's malloc settings (:mod:`comms.cloud.allocator`) keep for the next messages, which
    here also hold the freed tensors of earlier states (GBs in this one process)."""
    from comms.cloud import allocator
    from comms.wire import tensors as T

    gc.collect()
    T.release_free_buffers()
    allocator.trim()


# The robot of the memory figures: one subscription into a held torch model. Commands on stdin
# (a version number each); one JSON line on stdout per step.
_ROBOT = """
import sys
from comms.bench.weights_vla import robot_main
robot_main(sys.argv[1:])
"""


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def _reset_peak() -> None:
    """Start ``VmHWM`` again from the current resident set (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


class _AnonPeak:
    """The peak of the process's anonymous resident memory (``RssAnon``), sampled every 2 ms
    on a thread until :meth:`stop`. ``VmHWM`` also counts file-backed pages (the libraries'
    code), which the kernel may drop from the baseline under memory pressure, so a peak can
    read lower than baseline + model + copy; anonymous pages stay (no swap here)."""

    def __init__(self) -> None:
        self.peak = _status_kib("RssAnon") * 1024
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="anon-peak", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, _status_kib("RssAnon") * 1024)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, _status_kib("RssAnon") * 1024)


def robot_main(argv: Sequence[str]) -> None:
    """The child robot: ``address credential layers``; prints its baseline RSS, then for each
    version number read from stdin: resets the peak, says so, waits for the version, loads it
    into its model (``assign=True``: the parameters are the applied tensors) and prints the
    peak and the RSS."""
    import logging

    import torch

    from comms.bench.common import RUN
    from comms.config import CommsSettings
    from comms.robot.client import EdgeClient, make_channel
    from comms.robot.grpc_subscription import GrpcWeightSubscription

    logging.disable(logging.WARNING)
    address, credential, layers = argv[0], argv[1], int(argv[2])
    with torch.device("meta"):
        model = torch.nn.Module()
        model.layers = torch.nn.ModuleList(
            torch.nn.Linear(W0._WIDTH, W0._WIDTH, dtype=torch.bfloat16) for _ in range(layers)
        )
    s = CommsSettings()
    rx = WeightReceiver(as_torch=True)
    sub = GrpcWeightSubscription(EdgeClient(make_channel(address, s), credential, s), RUN, rx)
    time.sleep(0.5)
    baseline = {"rss": _status_kib("VmRSS") * 1024, "anon": _status_kib("RssAnon") * 1024}
    print(json.dumps(baseline), flush=True)
    for line in sys.stdin:
        version = int(line)
        _reset_peak()
        anon = _AnonPeak()
        print(json.dumps({"armed": version}), flush=True)
        ok = rx.wait_for(version, _TIMEOUT_S)
        got, state = rx.current()
        model.load_state_dict(state, strict=True, assign=True)
        del state
        out = {
            "version": got,
            "ok": ok,
            "peak": _status_kib("VmHWM") * 1024,
            "peak_anon": anon.stop(),
            "rss": _status_kib("VmRSS") * 1024,
            "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        }
        print(json.dumps(out), flush=True)
    sub.close()


def memory_rows(sizes: Sequence[int], log: Callable[[str], None]) -> list[MemoryRow]:
    """A child robot's peak RSS while it applies a full version, then a delta, into the model
    it holds, per size."""
    from comms.bench.common import RUN, start_cloud

    rows: list[MemoryRow] = []
    for n_params in sizes:
        mb = model_bytes(n_params)
        name = label(mb // 2)
        cloud = start_cloud()
        child: subprocess.Popen[str] | None = None
        try:
            (_, cred), *_ = cloud.robots(1)
            cmd = [sys.executable, "-c", _ROBOT, cloud.server.address, cred]
            child = W0._spawn([*cmd, str(W0._layers(n_params))])
            assert child.stdout is not None and child.stdin is not None
            base = json.loads(child.stdout.readline())
            pub = cloud.server.distributor(RUN)
            state = bf16_state(n_params)
            steps = [(0, "full into an empty robot"), (1, "full into held"), (2, "delta into held")]
            for version, what in steps:
                if version == 1:
                    state = bf16_state(n_params, seed=1)
                elif version == 2:
                    perturb(state)
                child.stdin.write(f"{version}\n")
                child.stdin.flush()
                assert json.loads(child.stdout.readline())["armed"] == version
                pub.publish(state, version=version)
                if version != 1:  # version 2 is version 1 changed in place
                    state.clear()
                gc.collect()
                got = json.loads(child.stdout.readline())
                assert got["ok"] and got["version"] == version, got
                assert got["param_bytes"] == mb, got
                rows.append(
                    MemoryRow(
                        name,
                        what,
                        mb,
                        int(base["rss"]),
                        int(got["peak"]),
                        int(base["anon"]),
                        int(got["peak_anon"]),
                    )
                )
                log(f"{name} {what}: peak {got['peak'] / _GIB:.2f} GiB rss {got['rss'] / _GIB:.2f}")
            child.stdin.close()
            child.wait(60)
        finally:
            if child is not None and child.poll() is None:
                child.kill()
                child.wait(10)
            cloud.close()
            _release_memory()
    return rows


def result(rows: list[VlaRow], mem: list[MemoryRow]) -> dict[str, Any]:
    """The keys the ``--vla`` run adds to the JSON line."""
    ratios = [r.ratio for r in rows if r.ratio is not None]
    return {
        "vla_push_ratio_vs_lerobot": round(max(ratios), 3) if ratios else None,
        "vla_push_s_per_case": {r.key: round(r.ours, 3) for r in rows},
        "vla_push_s_first_run_per_case": {r.key: round(r.first, 3) for r in rows},
        "vla_push_ratio_vs_lerobot_per_case": {
            r.key: None if r.ratio is None else round(r.ratio, 3) for r in rows
        },
        "vla_subscriber_mode_per_case": {r.key: r.mode for r in rows},
        "vla_sent_bytes_per_case": {r.key: r.sent_bytes for r in rows},
        "vla_bench_process_peak_bytes": max((r.process_peak for r in rows), default=0),
        "vla_robot_extra_copies_during_apply": {
            f"{m.params}_{m.version.split()[0]}"
            + ("_into_empty" if "empty" in m.version else ""): round(m.extra_copies, 3)
            for m in mem
        },
        "vla_robot_extra_copies_anon_during_apply": {
            f"{m.params}_{m.version.split()[0]}"
            + ("_into_empty" if "empty" in m.version else ""): round(m.extra_copies_anon, 3)
            for m in mem
        },
        "vla_robot_peak_bytes_during_apply": {
            f"{m.params}_{m.version.split()[0]}"
            + ("_into_empty" if "empty" in m.version else ""): m.peak - m.baseline
            for m in mem
        },
        "vla_robot_extra_copies_max": (
            round(max(m.extra_copies for m in mem if "held" in m.version), 3) if mem else None
        ),
    }


def print_tables(rows: list[VlaRow], mem: list[MemoryRow], repeats: int) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(
        title="VLA weights: publish -> every subscriber has it (loopback, BF16, "
        f"delta = {DELTA_FRACTION:.0%} of the elements changed; best of {repeats})"
    )
    cols = ("params", "subs", "path", "version", "robots", "MB sent", "robofleet s", "1st run s")
    for col in (*cols, "lerobot s", "ratio", "bench GiB"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(
            r.params,
            str(r.subscribers),
            "site relay" if r.relay else "direct",
            r.version,
            r.mode,
            f"{r.sent_bytes / 1e6:.0f}",
            f"{r.ours:.2f}",
            f"{r.first:.2f}",
            "-" if r.base is None else f"{r.base:.2f}",
            "-" if r.ratio is None else f"{r.ratio:.3f}",
            f"{r.process_peak / _GIB:.1f}",
        )
    c = Console(width=150)
    if rows:
        c.print(t)
    if not mem:
        return
    t2 = Table(title="robot peak memory while it applies a version (child process, 1 robot)")
    mcols = ("params", "version", "model GiB", "baseline GiB", "peak GiB", "extra copies")
    for col in (*mcols, "anon baseline GiB", "anon peak GiB", "extra copies (anon)"):
        t2.add_column(col, justify="right")
    for m in mem:
        t2.add_row(
            m.params,
            m.version,
            f"{m.model_bytes / _GIB:.2f}",
            f"{m.baseline / _GIB:.2f}",
            f"{m.peak / _GIB:.2f}",
            f"{m.extra_copies:.2f}",
            f"{m.baseline_anon / _GIB:.2f}",
            f"{m.peak_anon / _GIB:.2f}",
            f"{m.extra_copies_anon:.2f}",
        )
    c.print(t2)
