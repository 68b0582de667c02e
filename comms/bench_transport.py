"""``robofleet bench transport``: experience upload throughput (acknowledged bytes/s) vs raw
pyzmq PUSH/PULL on the same Arrow IPC bytes (no acks) and vs one pickled step per unary gRPC
call (the server only counts the bytes; nothing is unpickled). Loopback, in-memory sink.
Ours runs as deployed (batches on the ZeroMQ data plane, acks on gRPC) and, for reference,
with ``comms.data_plane`` off (batches on the gRPC stream).
Prints a table, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
import threading
import time
from collections.abc import Sequence
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import numpy as np


def _batches(n_batches: int, rows: int, obs_bytes: int) -> list[Any]:
    import pyarrow as pa

    rng = np.random.default_rng(0)
    out = []
    for b in range(n_batches):
        obs = rng.integers(0, 255, size=(rows, obs_bytes), dtype=np.uint8)
        out.append(
            pa.RecordBatch.from_pydict(
                {
                    "robot_id": pa.array([0] * rows, pa.int64()),
                    "seq": pa.array(range(b * rows, (b + 1) * rows), pa.int64()),
                    "observation": pa.FixedSizeListArray.from_arrays(
                        pa.array(obs.reshape(-1)), obs_bytes
                    ),
                }
            )
        )
    return out


def _ours(batches: list[Any], data_plane: bool = True) -> tuple[float, int]:
    import pyarrow as pa

    from comms.bench_common import RUN, start_cloud
    from comms.uploader import MemorySpool, Uploader

    cloud = start_cloud(data_plane=data_plane)
    ((rid, cred),) = cloud.robots(1)
    fixed = [b.set_column(0, "robot_id", pa.array([rid] * b.num_rows, pa.int64())) for b in batches]
    spool = MemorySpool()
    for b in fixed:
        spool.put(b)
    total = sum(len(e.data) for e in spool.entries_after(-1, 1 << 30))
    client = cloud.client(cred)
    t0 = time.perf_counter()
    up = Uploader(client, RUN, spool)
    last = int(fixed[-1].column("seq")[-1].as_py())
    assert up.wait_durable(last, 600), up.last_error
    dt = time.perf_counter() - t0
    up.close()
    client.close()
    cloud.close()
    return dt, total


def _zmq(payloads: list[bytes]) -> float:
    import zmq

    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    push = ctx.socket(zmq.PUSH)
    push.connect(f"tcp://127.0.0.1:{port}")
    got = [0]

    def recv() -> None:
        for _ in payloads:
            got[0] += len(pull.recv(copy=False).bytes)

    t = threading.Thread(target=recv)
    t.start()
    t0 = time.perf_counter()
    for p in payloads:
        push.send(p, copy=False)
    t.join()
    dt = time.perf_counter() - t0
    push.close(0)
    pull.close(0)
    ctx.term()
    return dt


def _unary_pickle(batches: list[Any], max_steps: int) -> tuple[float, int]:
    import grpc

    received = [0]

    def handler(request: bytes, context: Any) -> bytes:
        received[0] += len(request)  # counted, never unpickled
        return b""

    rpc_handler = grpc.method_handlers_generic_handler(
        "bench.Steps", {"Put": grpc.unary_unary_rpc_method_handler(handler)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((rpc_handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    ch = grpc.insecure_channel(f"127.0.0.1:{port}")
    put = ch.unary_unary("/bench.Steps/Put")
    steps = []
    for b in batches:
        cols = b.to_pydict()
        for i in range(b.num_rows):
            steps.append(
                {
                    "robot_id": cols["robot_id"][i],
                    "seq": cols["seq"][i],
                    "observation": np.asarray(cols["observation"][i], np.uint8),
                }
            )
            if len(steps) >= max_steps:
                break
        if len(steps) >= max_steps:
            break
    t0 = time.perf_counter()
    for s in steps:
        put(pickle.dumps(s), timeout=10)
    dt = time.perf_counter() - t0
    ch.close()
    server.stop(0)
    return dt, received[0]


@dataclass(frozen=True)
class _Measured:
    """Each path's times (s), a run per repeat, and the bytes each run moved."""

    total: int  # Arrow IPC bytes of the spooled batches (ours, both modes)
    total_zmq: int  # bytes of the Arrow IPC payloads raw pyzmq sends
    ours_runs: list[float]
    grpc_runs: list[float]  # ours with the data plane off
    zmq_runs: list[float]
    t_pickle: float
    pickle_bytes: int

    @property
    def ours_bps(self) -> float:
        return self.total / min(self.ours_runs)

    @property
    def grpc_bps(self) -> float:
        return self.total / min(self.grpc_runs)

    @property
    def zmq_bps(self) -> float:
        return self.total_zmq / min(self.zmq_runs)

    @property
    def pickle_bps(self) -> float:
        return self.pickle_bytes / self.t_pickle


def _measure(
    batches: list[Any], payloads: list[bytes], repeats: int, pickle_steps: int
) -> _Measured:
    """Ours (data plane on, then off) and raw pyzmq interleaved ``repeats`` times (the
    machine is shared: the rates take each path's best time), then ``pickle_steps`` steps
    pickled one per unary call."""
    ours_runs, grpc_runs, zmq_runs = [], [], []
    for _ in range(repeats):
        dt, total = _ours(batches)
        ours_runs.append(dt)
        grpc_runs.append(_ours(batches, data_plane=False)[0])
        zmq_runs.append(_zmq(payloads))
    t_pickle, pickle_bytes = _unary_pickle(batches, pickle_steps)
    total_zmq = sum(len(p) for p in payloads)
    return _Measured(total, total_zmq, ours_runs, grpc_runs, zmq_runs, t_pickle, pickle_bytes)


def _result(m: _Measured) -> dict[str, Any]:
    """The JSON line's object."""
    return {
        "upload_ratio_vs_zmq": round(m.ours_bps / m.zmq_bps, 3),
        "upload_ratio_vs_unary_pickle": round(m.ours_bps / m.pickle_bps, 3),
        "upload_ratio_vs_zmq_grpc_bytes_only": round(m.grpc_bps / m.zmq_bps, 3),
        "upload_bytes_per_s": round(m.ours_bps),
        "upload_bytes_per_s_grpc_bytes_only": round(m.grpc_bps),
        "zmq_bytes_per_s": round(m.zmq_bps),
        "unary_pickle_bytes_per_s": round(m.pickle_bps),
        "upload_bytes_per_s_runs": [round(m.total / x) for x in m.ours_runs],
        "zmq_bytes_per_s_runs": [round(m.total_zmq / x) for x in m.zmq_runs],
    }


def _print_table(m: _Measured, n_batches: int, repeats: int) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(
        title=f"experience upload, loopback, {m.total / 1e6:.0f} MB in {n_batches} Arrow batches"
        f" (best of {repeats})"
    )
    for col in ("path", "MB/s", "robofleet / path", "target"):
        t.add_column(col, justify="right")
    ours = m.ours_bps
    t.add_row("robofleet: ZeroMQ data plane, gRPC acks", f"{ours / 1e6:.1f}", "1.000", "")
    for path, bps, target in (
        ("robofleet: gRPC stream only (data plane off)", m.grpc_bps, ""),
        ("raw pyzmq PUSH/PULL (no acks)", m.zmq_bps, ">= 0.5"),
        ("pickled step per unary gRPC call", m.pickle_bps, ">= 3"),
    ):
        t.add_row(path, f"{bps / 1e6:.1f}", f"{ours / bps:.3f}", target)
    Console().print(t)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="robofleet bench transport", description=__doc__)
    parser.add_argument("--config", default=None)
    parser.add_argument("--quick", action="store_true", help="smaller volume")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args(list(argv))
    import logging

    logging.disable(logging.WARNING)
    from comms import steps as S

    n_batches = 100 if args.quick else 400
    batches = _batches(n_batches, rows=256, obs_bytes=2048)  # 512 KiB of observations a batch
    payloads = [S.encode_batch(b) for b in batches]
    repeats = 2 if args.quick else 3
    measured = _measure(batches, payloads, repeats, 2000 if args.quick else 5000)
    result = _result(measured)
    if not args.json:
        _print_table(measured, n_batches, repeats)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
