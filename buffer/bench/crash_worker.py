"""Processes for ``robofleet bench crash`` (and the crash tests): a buffer server and writers.

``python -m buffer.bench.crash_worker server DIR SOCKET`` opens a :class:`ReplayBuffer` in ``DIR``
and serves appends on a Unix socket: each request is one Arrow IPC record batch message (raw
bytes, never pickled), each reply is JSON ``{"acked": {robot_id: seq}}`` sent only after
``append`` returned (after fdatasync), or ``{"error": "..."}``. It prints one JSON line
``{"ready": true, "recovery_seconds": ..., "steps": ...}`` once open.

``python -m buffer.bench.crash_worker writer SOCKET ROBOT ACKFILE`` streams steps of one robot in
batches of 16; after each reply it appends the acknowledged seq to ``ACKFILE``. When the
server dies it reconnects and resends every record after the last acknowledged seq (so some
records are sent twice: the buffer must store them once).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from buffer.config import BufferSettings
from buffer.table.replay_buffer import ReplayBuffer
from buffer.table.schema import StepSchema

BATCH = 16
EPISODE = 50
IMAGE = (32, 32, 3)


def crash_schema() -> StepSchema:
    return StepSchema.from_features(
        {
            "observation.state": {"dtype": "float32", "shape": (8,)},
            "observation.images.front": {"dtype": "image", "shape": IMAGE},
        },
        {"action": {"dtype": "float32", "shape": (4,)}},
    )


def make_batch(schema: StepSchema, robot: str, first_seq: int, n: int) -> pa.RecordBatch:
    """Steps ``first_seq .. first_seq + n - 1`` of ``robot``; content derived from seq."""
    recs = []
    for seq in range(first_seq, first_seq + n):
        frame = seq % EPISODE
        done = frame == EPISODE - 1
        rec = {
            "seq": seq,
            "robot_id": robot,
            "run_id": "crash",
            "task": "reach-v3",
            "episode_index": seq // EPISODE,
            "frame_index": frame,
            "timestamp": frame / 10.0,
            "reward": float(seq % 7),
            "terminated": done,
            "truncated": False,
            "is_intervention": seq % 5 == 0,
            "policy_version": 0,
            "observation.state": np.full(8, seq, dtype=np.float32),
            "observation.images.front": np.full(IMAGE, seq % 251, dtype=np.uint8),
            "action": np.full(4, seq % 3, dtype=np.float32),
        }
        if done:
            rec["next.observation.state"] = np.full(8, -seq, dtype=np.float32)
            rec["next.observation.images.front"] = np.full(IMAGE, 255, dtype=np.uint8)
        recs.append(rec)
    return schema.batch_from_records(recs)


def stored_runs(buf: ReplayBuffer) -> dict[str, dict[str, object]]:
    """Per robot: the stored seqs as ``[start, end]`` runs and how many are stored twice,
    computed from the stored rows themselves (not from the de-duplication structures)."""
    idx = buf.index
    seqs, robots = idx.view("seq"), idx.view("robot")
    out: dict[str, dict[str, object]] = {}
    for code, name in enumerate(idx.robots.names):
        s = np.sort(seqs[robots == code])
        u = np.unique(s)
        brk = np.flatnonzero(np.diff(u) != 1) + 1
        runs = [[int(r[0]), int(r[-1])] for r in np.split(u, brk) if len(r)]
        out[name] = {"runs": runs, "duplicates": int(len(s) - len(u))}
    return out


def serve(directory: str, socket_path: str) -> int:
    schema = crash_schema()
    schema.validate(make_batch(schema, "warm-up", 0, 2))  # pay lazy imports before serving
    t0 = time.monotonic()
    buf = ReplayBuffer.open(
        directory, schema, BufferSettings(segment_target_bytes=2 * 1024**2, prefetch=False)
    )
    Path(socket_path).unlink(missing_ok=True)
    listener = Listener(socket_path, family="AF_UNIX")
    print(
        json.dumps(
            {
                "ready": True,
                "recovery_seconds": buf.recovery_seconds,
                "open_seconds": time.monotonic() - t0,
                "steps": buf.num_steps,
                "robots": stored_runs(buf),
            }
        ),
        flush=True,
    )

    def handle(conn: Connection) -> None:
        with conn:
            while True:
                try:
                    payload = conn.recv_bytes()
                except (EOFError, OSError):
                    return
                try:
                    batch = ipc.read_record_batch(pa.py_buffer(payload), schema.arrow_schema)
                    res = buf.append(batch)
                    reply: dict[str, object] = {"acked": res.acked}
                except Exception as exc:  # noqa: BLE001 - reported to the writer
                    reply = {"error": f"{type(exc).__name__}: {exc}"}
                try:
                    conn.send_bytes(json.dumps(reply).encode())
                except OSError:  # the writer is gone (killed at the end of the bench)
                    return

    while True:
        conn = listener.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


def write(socket_path: str, robot: str, ack_file: str) -> int:
    schema = crash_schema()
    acked = -1
    path = Path(ack_file)
    if path.exists():
        lines = path.read_text().split()
        if lines:
            acked = int(lines[-1])
    make_batch(schema, robot, 0, 1)  # pay lazy imports before connecting
    with open(path, "a") as log:
        while True:
            try:
                conn = Client(socket_path, family="AF_UNIX")
            except OSError:
                time.sleep(0.02)
                continue
            try:
                while True:
                    batch = make_batch(schema, robot, acked + 1, BATCH)
                    # Resend a few already-acked records too: the buffer must not store twice.
                    if acked >= 3 and (acked // BATCH) % 3 == 0:
                        batch = make_batch(schema, robot, acked - 3, BATCH + 4)
                    conn.send_bytes(batch.serialize().to_pybytes())
                    reply = json.loads(conn.recv_bytes())
                    if "error" in reply:
                        print(f"writer {robot}: {reply['error']}", file=sys.stderr, flush=True)
                        time.sleep(0.05)
                        continue
                    acked = int(reply["acked"][robot])
                    log.write(f"{acked}\n")
                    log.flush()
            except (EOFError, OSError, ConnectionError):
                conn.close()
                time.sleep(0.02)


def main(argv: list[str]) -> int:
    if argv[:1] == ["server"] and len(argv) == 3:
        return serve(argv[1], argv[2])
    if argv[:1] == ["writer"] and len(argv) == 4:
        return write(argv[1], argv[2], argv[3])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
