"""``robofleet bench transport``: experience upload throughput (acknowledged bytes/s) vs raw
pyzmq PUSH/PULL on the same Arrow IPC bytes (no acks) and vs one pickled step per unary gRPC
call (the server only counts the bytes; nothing is unpickled). Loopback; the cloud's sink keeps
each robot's seqs and drops the rows (an ack means parsed, validated and taken, not stored:
the replay buffer's fdatasynced acks are measured by ``bench fleet``).
Ours runs as deployed (batches on the ZeroMQ data plane, acks on gRPC) and, for reference,
with ``comms.data_plane`` off (batches on the gRPC stream); both sides are timed from
connected sockets (ours: once the stream is open and its first batch acked; the time that
took is reported beside). A second workload is camera-sized steps (two 128x128x3 uint8
frames and state, ~100 KB a step) in the 10-step batches an edge agent cuts at 20 Hz, against
raw pyzmq on the same bytes.
Prints a table, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import collections
import json
import pickle
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from concurrent import futures
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from foundation.clitext import plain_text


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


def _camera_batches(n_batches: int, steps: int = 10) -> list[Any]:
    """Camera-sized steps: two 128x128x3 uint8 frames, 39 state floats and 4 action floats
    (98,476 bytes of features a step), ``steps`` a batch (what the edge agent's uplink cuts at
    20 Hz: its 0.5 s batch delay)."""
    import pyarrow as pa

    rng = np.random.default_rng(1)
    frame = 128 * 128 * 3

    def fixed(values: np.ndarray, width: int) -> Any:
        return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), width)

    out = []
    for b in range(n_batches):
        cols = {
            "robot_id": pa.array([0] * steps, pa.int64()),
            "seq": pa.array(range(b * steps, (b + 1) * steps), pa.int64()),
            "observation.state": fixed(rng.standard_normal((steps, 39), np.float32), 39),
            "observation.images.front": fixed(
                rng.integers(0, 256, (steps, frame), np.uint8), frame
            ),
            "observation.images.wrist": fixed(
                rng.integers(0, 256, (steps, frame), np.uint8), frame
            ),
            "action": fixed(rng.uniform(-1, 1, (steps, 4)).astype(np.float32), 4),
        }
        out.append(pa.RecordBatch.from_pydict(cols))
    return out


class _Preloaded:
    """A :class:`comms.robot.uploader.Spool` of encoded batches, filled in one step (so the upload
    is timed, not the spooling)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._entries: collections.deque[Any] = collections.deque()

    def load(self, entries: list[Any]) -> None:
        with self._cond:
            self._entries.extend(entries)
            self._cond.notify_all()

    def entries_after(self, seq: int, limit: int) -> list[Any]:
        with self._cond:
            return [e for e in self._entries if e.last_seq > seq][:limit]

    def ack(self, durable_seq: int) -> None:
        with self._cond:
            while self._entries and self._entries[0].last_seq <= durable_seq:
                self._entries.popleft()

    def wait(self, after_seq: int, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(
                lambda: bool(self._entries) and self._entries[-1].last_seq > after_seq, timeout
            )


def _ours(batches: list[Any], data_plane: bool = True) -> tuple[float, int, float]:
    """Seconds to upload ``batches`` through a connected uplink until the last is acked, the
    bytes, and the seconds the stream took to open (the first batch sent alone and acked:
    stream, credential and lease checks, data-plane handshake); like the raw ZeroMQ side,
    whose sockets are connected before its clock starts."""
    import pyarrow as pa

    from comms.bench.common import RUN, start_cloud
    from comms.cloud.step_sink import MemorySink
    from comms.robot.uploader import SpoolEntry, Uploader
    from comms.wire import steps as S

    # The sink validates nothing more and keeps the seqs, not the bytes, as the raw ZeroMQ
    # receiver keeps nothing: both sides measure the transport.
    cloud = start_cloud(MemorySink(keep_rows=False), data_plane=data_plane)
    ((rid, cred),) = cloud.robots(1)
    fixed = [b.set_column(0, "robot_id", pa.array([rid] * b.num_rows, pa.int64())) for b in batches]
    entries = [SpoolEntry(S.last_seq(b), S.encode_batch(b)) for b in fixed]
    total = sum(len(e.data) for e in entries[1:])
    spool = _Preloaded()
    client = cloud.client(cred)
    t_open = time.perf_counter()
    up = Uploader(client, RUN, spool)
    spool.load(entries[:1])
    assert up.wait_durable(entries[0].last_seq, 60), up.last_error
    t0 = time.perf_counter()
    spool.load(entries[1:])
    assert up.wait_durable(entries[-1].last_seq, 600), up.last_error
    dt = time.perf_counter() - t0
    up.close()
    client.close()
    cloud.close()
    return dt, total, t0 - t_open


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

    total: int  # Arrow IPC bytes ours times (every batch but the first, sent to open the stream)
    total_zmq: int  # bytes of the Arrow IPC payloads raw pyzmq sends
    ours_runs: list[float]
    open_runs: list[float]  # s to open ours' stream (first batch acked), not in ours_runs
    grpc_runs: list[float]  # ours with the data plane off
    zmq_runs: list[float]
    t_pickle: float = 0.0
    pickle_bytes: int = 0

    @property
    def ours_bps(self) -> float:
        return self.total / min(self.ours_runs)

    @property
    def grpc_bps(self) -> float:
        return self.total / min(self.grpc_runs) if self.grpc_runs else float("nan")

    @property
    def zmq_bps(self) -> float:
        return self.total_zmq / min(self.zmq_runs)

    def round_ratios(self) -> list[float]:
        """Ours / raw pyzmq per round (each pair ran back to back, so a round's ratio is
        free of the machine's slower and faster minutes)."""
        return [
            (self.total / o) / (self.total_zmq / z)
            for o, z in zip(self.ours_runs, self.zmq_runs, strict=True)
        ]

    def median_ratio(self) -> float:
        return float(statistics.median(self.round_ratios()))

    @property
    def pickle_bps(self) -> float:
        return self.pickle_bytes / self.t_pickle if self.t_pickle else float("nan")


def _measure(batches: list[Any], repeats: int, grpc_only: bool = True) -> _Measured:
    """Ours (data plane on, then off when ``grpc_only``) and raw pyzmq on the same Arrow IPC
    bytes, interleaved ``repeats`` times (the machine is shared: the rates take each path's
    best time)."""
    from comms.wire import steps as S

    payloads = [S.encode_batch(b) for b in batches]
    ours_runs, open_runs, grpc_runs, zmq_runs = [], [], [], []
    total = 0
    for _ in range(repeats):
        dt, total, t_open = _ours(batches)
        ours_runs.append(dt)
        open_runs.append(t_open)
        if grpc_only:
            grpc_runs.append(_ours(batches, data_plane=False)[0])
        zmq_runs.append(_zmq(payloads))
    total_zmq = sum(len(p) for p in payloads)
    return _Measured(total, total_zmq, ours_runs, open_runs, grpc_runs, zmq_runs)


def _result(m: _Measured, cam: _Measured) -> dict[str, Any]:
    """The JSON line's object."""
    return {
        "upload_ratio_vs_zmq": round(m.ours_bps / m.zmq_bps, 3),
        "upload_ratio_vs_unary_pickle": round(m.ours_bps / m.pickle_bps, 3),
        "upload_ratio_vs_zmq_grpc_bytes_only": round(m.grpc_bps / m.zmq_bps, 3),
        "camera_upload_ratio_vs_zmq": round(cam.ours_bps / cam.zmq_bps, 3),
        "upload_ratio_median": round(m.median_ratio(), 3),
        "camera_upload_ratio_median": round(cam.median_ratio(), 3),
        "upload_ratio_rounds": [round(r, 3) for r in m.round_ratios()],
        "camera_upload_ratio_rounds": [round(r, 3) for r in cam.round_ratios()],
        "upload_bytes_per_s": round(m.ours_bps),
        "upload_bytes_per_s_grpc_bytes_only": round(m.grpc_bps),
        "zmq_bytes_per_s": round(m.zmq_bps),
        "unary_pickle_bytes_per_s": round(m.pickle_bps),
        "camera_upload_bytes_per_s": round(cam.ours_bps),
        "camera_zmq_bytes_per_s": round(cam.zmq_bps),
        "stream_open_s": round(min(m.open_runs), 4),
        "upload_bytes_per_s_runs": [round(m.total / x) for x in m.ours_runs],
        "zmq_bytes_per_s_runs": [round(m.total_zmq / x) for x in m.zmq_runs],
    }


def _print_table(m: _Measured, cam: _Measured, n_batches: int, repeats: int) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(
        title=f"experience upload, loopback, best of {repeats}: {m.total / 1e6:.0f} MB in "
        f"{n_batches} Arrow batches of 256 steps x 2 KB; camera steps: {cam.total / 1e6:.0f} MB "
        "of 10-step batches, 2 x 128x128x3 uint8 + state (98 KB a step)"
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
    t.add_row("camera steps: robofleet (data plane, acks)", f"{cam.ours_bps / 1e6:.1f}", "", "")
    t.add_row(
        "camera steps: raw pyzmq PUSH/PULL (no acks)",
        f"{cam.zmq_bps / 1e6:.1f}",
        f"{cam.ours_bps / cam.zmq_bps:.3f}",
        "",
    )
    c = Console()
    c.print(t)
    c.print(
        f"Median over {repeats} rounds of robofleet / raw pyzmq, each round's pair back to back:"
        f" {m.median_ratio():.3f} (rounds {', '.join(f'{r:.3f}' for r in m.round_ratios())});"
        f" camera steps {cam.median_ratio():.3f}"
        f" (rounds {', '.join(f'{r:.3f}' for r in cam.round_ratios())})."
    )
    c.print(
        "Delivery: robofleet acks each batch after the cloud parsed and validated it and its "
        "sink took it (here a sink that records each robot's seqs and drops the rows, no "
        "fsync; with the replay buffer an ack means fdatasynced, see `robofleet bench fleet`); "
        "raw pyzmq has no acks, its receiver counts and drops the bytes. Same bytes on both "
        "sides, timed from connected sockets; opening robofleet's stream "
        f"(credential, lease, data-plane handshake, first batch acked) took "
        f"{min(m.open_runs) * 1000:.0f} ms more."
    )


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="robofleet bench transport", description=plain_text(__doc__)
    )
    parser.add_argument("--config", default=None, help="robofleet settings file")
    parser.add_argument("--quick", action="store_true", help="smaller volume")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    parser.add_argument(
        "--rounds", type=int, default=None, help="interleaved rounds (default 3; --quick 2)"
    )
    args = parser.parse_args(list(argv))
    if args.rounds is not None and args.rounds < 1:
        print("bench transport: --rounds must be >= 1", file=sys.stderr)
        return 2
    import logging

    logging.disable(logging.WARNING)
    n_batches = 100 if args.quick else 400
    batches = _batches(n_batches, rows=256, obs_bytes=2048)  # 512 KiB of observations a batch
    repeats = args.rounds or (2 if args.quick else 3)
    measured = _measure(batches, repeats)
    t_pickle, pickle_bytes = _unary_pickle(batches, 2000 if args.quick else 5000)
    measured = replace(measured, t_pickle=t_pickle, pickle_bytes=pickle_bytes)
    camera = _measure(_camera_batches(50 if args.quick else 200), repeats, grpc_only=False)
    result = _result(measured, camera)
    if not args.json:
        _print_table(measured, camera, n_batches, repeats)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
