"""``robofleet bench weights``: push a new policy version to 1/4/16 subscribers on loopback,
side by side with LeRobot's path (``torch.save`` bytes in the 2 MB chunks of
``lerobot.transport.utils`` over gRPC, ``torch.load(weights_only=True)`` on the robot).

Measures, per (model size, subscribers): time from publish until every subscriber has applied
the version. Also: our serialization vs a raw copy of the tensors, delta bytes vs changed
elements x (index + value), and the learner's step time with a push every second vs none.
Prints a table, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent import futures
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from comms.bench.weights_vla_cli import add_arguments as add_vla_arguments
from comms.bench.weights_vla_cli import run_vla
from foundation.clitext import plain_text

if TYPE_CHECKING:
    from comms.bench.common import BenchCloud
    from comms.cloud.weight_file import WeightDirectory
    from comms.robot.receiver import WeightReceiver


_WIDTH = 1024  # every bench model is square layers of this width


def _layers(n_params: int) -> int:
    """How many ``_WIDTH`` x ``_WIDTH`` layers make about ``n_params`` parameters (at least 1)."""
    return max(1, n_params // (_WIDTH * _WIDTH))


def _state(n_params: int, seed: int = 0) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(seed)
    layers = _layers(n_params)
    state = {f"layers.{i}.weight": torch.randn(_WIDTH, _WIDTH, generator=g) for i in range(layers)}
    state.update({f"layers.{i}.bias": torch.randn(_WIDTH, generator=g) for i in range(layers)})
    return state


def _ours(state: dict[str, Any], n_subs: int) -> float:
    from comms.bench.common import RUN, start_cloud
    from comms.robot.grpc_subscription import GrpcWeightSubscription
    from comms.robot.receiver import WeightReceiver

    cloud = start_cloud()
    robots = cloud.robots(n_subs)
    clients = [cloud.client(c) for _, c in robots]
    rxs = [WeightReceiver(as_torch=True) for _ in robots]
    srcs = [GrpcWeightSubscription(c, RUN, rx) for c, rx in zip(clients, rxs, strict=True)]
    # 0.5 s for the subscriptions to open.
    dt = _push_time(cloud, state, rxs, 0.5, "a subscriber never applied the version")
    _close_all([*srcs, *clients])
    cloud.close()
    del rxs, srcs
    gc.collect()
    return dt


def _push_time(
    cloud: BenchCloud, state: dict[str, Any], rxs: list[WeightReceiver], settle_s: float, what: str
) -> float:
    """Seconds from publishing ``state`` as version 0 (after ``settle_s`` of set-up) until
    every receiver applied it.

    Raises:
        AssertionError: ``what``, when a receiver did not apply it within 120 s.
    """
    from comms.bench.common import RUN

    pub = cloud.server.distributor(RUN)
    time.sleep(settle_s)
    t0 = time.perf_counter()
    pub.publish(state)
    ok = all(rx.wait_for(0, 120) for rx in rxs)
    dt = time.perf_counter() - t0
    assert ok, what
    return dt


def _close_all(closeables: Sequence[Any]) -> None:
    for c in closeables:
        c.close()


def _via_relay(state: dict[str, Any], n_subs: int) -> float:
    """The site path: the relay fetches the version once over gRPC and fans it out to the
    robots over ZeroMQ (each robot still checks every chunk's digest and the manifest's HMAC)."""
    from comms.bench.common import RUN, start_cloud
    from comms.relay.site_relay import SiteRelay
    from comms.robot.client import EdgeClient, make_channel
    from comms.robot.receiver import WeightReceiver
    from comms.robot.zmq_subscription import ZmqWeightSubscription

    cloud = start_cloud()
    robots = cloud.robots(n_subs)
    relay = SiteRelay(cloud.settings, cloud_address=cloud.server.address, port=0, zmq_port=0)
    relay.start()
    clients = [
        EdgeClient(make_channel(relay.address, cloud.settings), c, cloud.settings)
        for _, c in robots
    ]
    rxs = [WeightReceiver(as_torch=True) for _ in robots]
    srcs = [
        ZmqWeightSubscription(c, relay.zmq_address, RUN, rx)
        for c, rx in zip(clients, rxs, strict=True)
    ]
    # 1 s for the robots to register and the relay to subscribe upstream.
    dt = _push_time(cloud, state, rxs, 1.0, "a robot behind the relay never applied the version")
    _close_all([*srcs, *clients])
    relay.stop()
    cloud.close()
    del rxs, srcs
    gc.collect()
    return dt


def _lerobot(
    state: dict[str, Any], n_subs: int, keep: bool = True, timeout_s: float = 120.0
) -> float:
    """LeRobot's learner->actor parameter path, with its own messages and helpers.

    ``keep``: every actor holds the state it loaded until all are done (else it drops it once
    loaded). An actor not done within ``timeout_s`` fails the case."""
    import grpc
    import torch
    from lerobot.transport import services_pb2, services_pb2_grpc
    from lerobot.transport.utils import (
        bytes_to_state_dict,
        grpc_channel_options,
        receive_bytes_in_chunks,
        send_bytes_in_chunks,
        state_to_bytes,
    )

    ready = threading.Event()
    payload: dict[str, bytes] = {}

    class Learner(services_pb2_grpc.LearnerServiceServicer):
        def StreamParameters(self, request: Any, context: Any) -> Any:
            ready.wait()
            yield from send_bytes_in_chunks(payload["b"], services_pb2.Parameters)

    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=n_subs + 2), options=grpc_channel_options()
    )
    services_pb2_grpc.add_LearnerServiceServicer_to_server(Learner(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    done: list[dict[str, torch.Tensor] | None] = []
    lock = threading.Lock()
    shutdown = threading.Event()

    def actor() -> None:
        ch = grpc.insecure_channel(f"127.0.0.1:{port}", options=grpc_channel_options())
        stub = services_pb2_grpc.LearnerServiceStub(ch)
        data = receive_bytes_in_chunks(stub.StreamParameters(services_pb2.Empty()), None, shutdown)
        sd = bytes_to_state_dict(data)
        del data
        with lock:
            done.append(sd if keep else None)
        del sd
        ch.close()

    threads = [threading.Thread(target=actor) for _ in range(n_subs)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    t0 = time.perf_counter()
    payload["b"] = state_to_bytes(state)
    ready.set()
    end = time.monotonic() + timeout_s
    for t in threads:
        t.join(timeout=max(0.0, end - time.monotonic()))
    dt = time.perf_counter() - t0
    assert len(done) == n_subs, "a LeRobot actor never received the parameters"
    server.stop(0)
    done.clear()
    payload.clear()
    gc.collect()
    return dt


def _serialize_ratio(state: dict[str, Any], repeats: int = 3) -> tuple[float, float]:
    import torch

    from comms.wire.weight_codec import Snapshot

    def best(fn: Any) -> float:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - t0)
            del out
        return min(times)

    t_copy = best(lambda: {k: torch.empty_like(v).copy_(v) for k, v in state.items()})
    t_ours = best(lambda: Snapshot.take(state, 0))
    return t_ours, t_copy


def _delta_ratio(state: dict[str, Any], fraction: float = 0.01) -> tuple[int, int, float]:
    from comms.wire.weight_codec import Snapshot, encode_delta

    base = Snapshot.take(state, 0)
    rng = np.random.default_rng(1)
    changed = 0
    new = {}
    for k, v in state.items():
        a = v.numpy().copy()
        idx = rng.choice(a.size, size=max(1, int(a.size * fraction)), replace=False)
        a.reshape(-1)[idx] += 1.0
        changed += idx.size
        new[k] = a
    delta = encode_delta("bench", base, Snapshot.take(new, 1))
    assert delta is not None
    ideal = changed * (4 + 4)  # int32 index + float32 value
    return len(delta.payload), ideal, len(delta.payload) / ideal


_SUBSCRIBERS = """
import sys, time
from comms.bench.common import RUN
from comms.robot.client import EdgeClient, make_channel
from comms.config import CommsSettings
from comms.robot.receiver import WeightReceiver
from comms.robot.grpc_subscription import GrpcWeightSubscription
address, creds = sys.argv[1], sys.argv[2:]
s = CommsSettings()
srcs = [GrpcWeightSubscription(EdgeClient(make_channel(address, s), c, s), RUN, WeightReceiver()) for c in creds]
print("ready", flush=True)
sys.stdin.read()
print(sum(x.versions_applied for x in srcs), flush=True)
"""

# The cloud process of a deployment: gRPC server, robots, and the feed that publishes the
# weight files the learner writes.
_CLOUD = """
import json, logging, sys
from pathlib import Path
logging.disable(logging.WARNING)
from comms.bench.common import RUN, start_cloud
from comms.cloud.weight_file import WeightFileFeed
cloud = start_cloud(weight_max_bytes_per_s=float(sys.argv[3]))
robots = cloud.robots(int(sys.argv[2]))
feed = WeightFileFeed(cloud.server.distributor(RUN), Path(sys.argv[1])).start()
print(json.dumps({"address": cloud.server.address, "creds": [c for _, c in robots]}), flush=True)
sys.stdin.read()
feed.close()
print(feed.published, flush=True)
cloud.close()
"""


class _Learner:
    """A training loop of about ``n_params`` parameters (``_WIDTH`` square linear layers,
    Adam, a batch of 32) on one torch thread, which can write its weights to a
    ``WeightDirectory`` once a second while it trains."""

    def __init__(self, n_params: int) -> None:
        import torch

        torch.set_num_threads(1)
        self.model = torch.nn.Sequential(
            *[torch.nn.Linear(_WIDTH, _WIDTH) for _ in range(_layers(n_params))]
        )
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        self.x = torch.randn(32, _WIDTH)
        self.versions_written = 0

    def step(self) -> None:
        loss = self.model(self.x).pow(2).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()

    def run(self, span: float, directory: WeightDirectory | None = None) -> list[float]:
        """Train for ``span`` s; the seconds of each step (a push included), writing the
        next version to ``directory`` (when given) at the first step of each second."""
        import torch

        times = []
        end = time.perf_counter() + span
        next_push = time.perf_counter()
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            self.step()
            if directory is not None and t0 >= next_push:
                self.versions_written += 1
                with torch.no_grad():
                    directory.publish(self.versions_written, self.model.state_dict())
                next_push += 1.0
            times.append(time.perf_counter() - t0)
        return times


class _LearnerFigures(NamedTuple):
    without: float  # mean step s without pushes
    with_push: float  # mean step s with a push every second
    written: int  # versions the learner wrote
    applied: int  # versions the subscribers applied, all of them together


def _learner_ratio(
    n_params: int, cycles: int, n_subs: int = 4, cap_bytes_per_s: float = 0.0
) -> _LearnerFigures:
    """Mean step time of a training loop without pushes / with a push every second.

    Deployed as in ``robofleet cloud``: the learner process writes each version to a file
    (``comms.cloud.weight_file.WeightDirectory``, as a run's learner does, here in /dev/shm) and the
    cloud process (here a subprocess with the gRPC server) publishes it to ``n_subs``
    subscribers (another subprocess). Both loops run in this same process run, one after the
    other.
    """
    import tempfile

    from comms.cloud.weight_file import WeightDirectory

    learner = _Learner(n_params)
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="robofleet-bench-weights-", dir=shm) as tmp:
        directory = WeightDirectory(tmp, keep=5)  # as the run's learner process keeps them
        cloud = _spawn([sys.executable, "-c", _CLOUD, tmp, str(n_subs), str(cap_bytes_per_s)])
        subs: subprocess.Popen[str] | None = None
        try:
            assert cloud.stdout is not None
            info = json.loads(cloud.stdout.readline())
            # The subscribers stand in for robots, whose CPUs are elsewhere: lowest priority.
            subs = _spawn(
                ["nice", "-n", "19", sys.executable, "-c", _SUBSCRIBERS, info["address"]]
                + info["creds"]
            )
            assert subs.stdout is not None and subs.stdout.readline().strip() == "ready"
            without, with_push = _step_times(learner, directory, cycles)
            time.sleep(3.0)  # the last version reaches the robots
            out, _ = subs.communicate("", timeout=60)
            applied = int(out.strip().splitlines()[-1])
            cloud.communicate("", timeout=60)
        finally:
            for p in (subs, cloud):
                if p is not None and p.poll() is None:
                    p.kill()
                    p.wait(10)
    return _LearnerFigures(without, with_push, learner.versions_written, applied)


def _spawn(cmd: list[str]) -> subprocess.Popen[str]:
    """A child process talking text lines on its stdin and stdout."""
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _step_times(learner: _Learner, directory: WeightDirectory, cycles: int) -> tuple[float, float]:
    """Mean step s (without pushes, with a push every second) after 3 warm-up steps.

    Interleaved, because the load of a shared machine drifts: pushing 2 s (two versions),
    1 s unmeasured for the last push to drain, 2 s quiet; ``cycles`` times.
    """
    for _ in range(3):
        learner.step()
    quiet: list[float] = []
    pushing: list[float] = []
    for _ in range(cycles):
        pushing += learner.run(2.0, directory)
        learner.run(1.0)
        quiet += learner.run(2.0)
    return float(np.mean(quiet)), float(np.mean(pushing))


class _PushRow(NamedTuple):
    params: str  # e.g. "9M"
    subscribers: int
    ours: float  # s, best of the repeats
    base: float  # LeRobot's s, best of the repeats
    ratio: float  # ours / base


class _CodecFigures(NamedTuple):
    t_ours: float  # s to take a Snapshot of 10M parameters
    t_copy: float  # s to copy the tensors
    delta_bytes: int  # a delta's payload with 1% of the elements changed
    ideal_bytes: int  # changed elements x (int32 index + float32 value)
    delta_ratio: float  # delta_bytes / ideal_bytes


def _push_rows(quick: bool, repeats: int) -> tuple[list[_PushRow], list[_PushRow]]:
    """Weight push times, ours (direct, and via the site relay for 4 and 16 robots of the
    10M model) and LeRobot's, per model size and subscriber count."""
    cases: list[tuple[int, list[int]]] = [(10_000_000, [1, 4, 16])]
    if not quick:
        # 16 robots x (payload + tensors) of 100M float32 on each side would not fit next to
        # other work in 24 GiB; 100M runs to 1 and 4 subscribers.
        cases.append((100_000_000, [1, 4]))
    rows: list[_PushRow] = []
    relay_rows: list[_PushRow] = []
    for n_params, subs in cases:
        state = _state(n_params)
        real = sum(v.numel() for v in state.values())
        for n in subs:
            # The machine is shared: both paths interleaved ``repeats`` times, best kept.
            ours_runs, base_runs = [], []
            for _ in range(repeats):
                ours_runs.append(_ours(state, n))
                base_runs.append(_lerobot(state, n))
            ours, base = min(ours_runs), min(base_runs)
            rows.append(_PushRow(f"{real / 1e6:.0f}M", n, ours, base, ours / base))
            if n > 1 and n_params <= 10_000_000:
                relay_t = min(_via_relay(state, n) for _ in range(repeats))
                relay_rows.append(_PushRow(f"{real / 1e6:.0f}M", n, relay_t, base, relay_t / base))
        del state
        gc.collect()
    return rows, relay_rows


def _codec_figures() -> _CodecFigures:
    """Serialization and delta figures of a 10M-parameter state."""
    state = _state(10_000_000)
    t_ours, t_copy = _serialize_ratio(state)
    delta_bytes, ideal_bytes, delta_ratio = _delta_ratio(state)
    del state
    gc.collect()
    return _CodecFigures(t_ours, t_copy, delta_bytes, ideal_bytes, delta_ratio)


def _parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="robofleet bench weights", description=plain_text(__doc__)
    )
    parser.add_argument("--config", default=None, help="robofleet settings file")
    parser.add_argument(
        "--quick", action="store_true", help="10M parameters only, short learner run"
    )
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    parser.add_argument(
        "--learner-cap-mb",
        type=float,
        default=100.0,
        help="comms.weight_max_bytes_per_s of the cloud in the learner run, MB/s (0 = none)",
    )
    add_vla_arguments(parser)
    return parser.parse_args(list(argv))


def _result(
    rows: list[_PushRow],
    relay_rows: list[_PushRow],
    codec: _CodecFigures,
    learner: _LearnerFigures,
    cap_bytes_per_s: float,
) -> dict[str, Any]:
    """The JSON line's object."""
    return {
        "push_ratio_vs_lerobot": round(max(r.ratio for r in rows), 3),
        "serialize_ratio_vs_memcpy": round(codec.t_ours / codec.t_copy, 3),
        "delta_bytes_ratio_vs_changed_elements": round(codec.delta_ratio, 3),
        "learner_step_ratio_with_push": round(learner.without / learner.with_push, 3),
        "push_ratio_vs_lerobot_per_case": {
            f"{r.params}x{r.subscribers}": round(r.ratio, 3) for r in rows
        },
        "push_ratio_vs_lerobot_via_site_relay_per_case": {
            f"{r.params}x{r.subscribers}": round(r.ratio, 3) for r in relay_rows
        },
        "versions_written_by_learner": learner.written,
        "versions_applied_by_subscribers_during_learner_run": learner.applied,
        "learner_run_weight_cap_bytes_per_s": cap_bytes_per_s,
    }


def _print_tables(
    rows: list[_PushRow],
    relay_rows: list[_PushRow],
    repeats: int,
    codec: _CodecFigures,
    learner: _LearnerFigures,
) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(
        title=f"weight push: publish -> applied by every subscriber (loopback, best of {repeats})"
    )
    for col in ("params", "subscribers", "robofleet s", "lerobot s", "ratio (target <= 0.5)"):
        t.add_column(col, justify="right")
    for p, n, o, b, r in rows:
        t.add_row(p, str(n), f"{o:.3f}", f"{b:.3f}", f"{r:.3f}")
    for p, n, o, b, r in relay_rows:
        t.add_row(p, f"{n} via site relay", f"{o:.3f}", f"{b:.3f}", f"{r:.3f}")
    c = Console()
    c.print(t)
    t2 = Table(title="serialization, delta, learner")
    t2.add_column("measure")
    t2.add_column("robofleet", justify="right")
    t2.add_column("reference", justify="right")
    t2.add_column("ratio", justify="right")
    t2.add_row(
        "serialize 10M (s) vs torch copy",
        f"{codec.t_ours:.4f}",
        f"{codec.t_copy:.4f}",
        f"{codec.t_ours / codec.t_copy:.3f} (<= 1.5)",
    )
    t2.add_row(
        "delta bytes (1% changed) vs idx+val",
        str(codec.delta_bytes),
        str(codec.ideal_bytes),
        f"{codec.delta_ratio:.3f}",
    )
    t2.add_row(
        f"learner step s: none / push 1 Hz ({learner.written} written, {learner.applied} "
        "applied by 4)",
        f"{learner.without:.4f}",
        f"{learner.with_push:.4f}",
        f"{learner.without / learner.with_push:.3f} (>= 0.9)",
    )
    c.print(t2)


def main(argv: Sequence[str]) -> int:
    args = _parse_args(argv)
    import logging

    logging.disable(logging.WARNING)
    import torch

    torch.set_num_threads(2)
    if args.vla_only:
        print(json.dumps(run_vla(args)))
        return 0
    repeats = 2 if args.quick else 3
    rows, relay_rows = _push_rows(args.quick, repeats)
    codec = _codec_figures()
    cap = args.learner_cap_mb * 1e6
    learner = _learner_ratio(10_000_000, 2 if args.quick else 5, cap_bytes_per_s=cap)
    result = _result(rows, relay_rows, codec, learner, cap)
    if not args.json:
        _print_tables(rows, relay_rows, repeats, codec, learner)
    if args.vla:
        result.update(run_vla(args))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
