"""The processes of ``robofleet bench fleet``: one cloud, a few uplink drivers.

The cloud process (:func:`serve_cloud`) is a real comms server whose sink is a real replay
buffer (acks after its fdatasync); it enrolls the robots, prints their credentials as one JSON
line, serves until its stdin closes, then prints what the buffer holds.

A driver process (:func:`drive`) plays ``len(robots)`` robots without physics: each replays a
recorded episode at ``hz`` steps/s, cut into batches of ``batch_steps`` steps as the edge
agent's uplink cuts them, through a real :class:`comms.robot.uploader.Uploader` (gRPC stream, ZeroMQ
data plane). Each batch's ack latency is the time from its spooling to the ack that covers it.
Both talk JSON lines on stdin/stdout.

Across hosts (``robofleet bench fleet --hosts``) the cloud process is
:func:`serve_sharded_cloud`: it joins the hosts' Ray cluster, starts a sharded buffer's
``BufferShard`` actors on the hosts that offer :data:`SHARD_RESOURCE`, each with its own
ingest endpoint (``comms.cloud.shard_ingest``), and serves the robots' ``Ingest.Route`` calls
(their shard's address and a shard ticket, ``comms.cloud.shard_routes``). Its drivers give
each uploader a :class:`comms.robot.shard_route.ShardRouter`, so every batch goes straight to
the robot's shard, as a sharded run's robot computers upload.
"""

from __future__ import annotations

import collections
import heapq
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from comms.robot.uploader import SpoolEntry

RECORDED_BATCHES = 8  # a recorded episode's distinct batches, replayed round robin
SPOOL_CAP_BYTES = 256 * 1024**2  # per driver: unacked bytes beyond this are not produced
SHARD_RESOURCE = "robofleet/bench-shard"  # what the shard hosts offer, one unit a shard
SHARD_BUDGET_BYTES = 256 * 1024**2  # each shard's hot-tier budget (one cloud's, above)


def features(kind: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(observation features, action features) of a step kind.

    ``state``: a Meta-World Sawyer's 39 floats; ``camera``: the same plus two 128x128x3 uint8
    cameras (about 100 KB a step).

    Raises:
        ValueError: an unknown kind.
    """
    obs: dict[str, Any] = {"observation.state": {"dtype": "float32", "shape": (39,)}}
    if kind == "camera":
        for cam in ("front", "wrist"):
            obs[f"observation.images.{cam}"] = {"dtype": "image", "shape": (128, 128, 3)}
    elif kind != "state":
        raise ValueError(f"unknown step kind {kind!r} (state, camera)")
    return obs, {"action": {"dtype": "float32", "shape": (4,)}}


def schema(kind: str) -> Any:
    from buffer import StepSchema

    obs, act = features(kind)
    return StepSchema.from_features(obs, act, require_final_observation=False)


def recording(kind: str, batch_steps: int, run_id: str) -> list[pa.RecordBatch]:
    """A recorded episode: ``RECORDED_BATCHES`` batches of random steps (robot ``"0"``, seqs
    from 0), re-stamped per robot and batch by :func:`stamp`."""
    sch = schema(kind)
    rng = np.random.default_rng(0)
    out = []
    for b in range(RECORDED_BATCHES):
        recs = []
        for i in range(batch_steps):
            s = b * batch_steps + i
            rec: dict[str, Any] = {
                "seq": s,
                "robot_id": "0",
                "run_id": run_id,
                "task": "reach-v3",
                "episode_index": 0,
                "frame_index": s,
                "timestamp": s / 20,
                "reward": 0.0,
                "terminated": False,
                "truncated": False,
                "is_intervention": bool(i % 3 == 0),
                "policy_version": 0,
                "action": rng.uniform(-1, 1, 4).astype(np.float32),
            }
            for name, f in sch.observations.items():
                if f.is_image:
                    rec[name] = rng.integers(0, 256, f.shape, dtype=np.uint8)
                else:
                    rec[name] = rng.standard_normal(f.shape).astype(np.float32)
            recs.append(rec)
        out.append(sch.batch_from_records(recs))
    return out


def stamp(template: pa.RecordBatch, robot_id: int, first_seq: int) -> pa.RecordBatch:
    """``template`` as robot ``robot_id``'s steps ``first_seq ..`` of one long episode."""
    n = template.num_rows
    seq = pa.array(np.arange(first_seq, first_seq + n, dtype=np.int64))
    names = template.schema.names
    b = template.set_column(names.index("seq"), "seq", seq)
    b = b.set_column(names.index("frame_index"), "frame_index", seq)
    b = b.set_column(
        names.index("timestamp"), "timestamp", pa.array(np.arange(first_seq, first_seq + n) / 20)
    )
    return b.set_column(names.index("robot_id"), "robot_id", pa.array([str(robot_id)] * n))


class TimedSpool:
    """A :class:`comms.robot.uploader.Spool` in memory that records, for each batch, the seconds
    from :meth:`put` to the ack that covers it (no validation: the batches are the bench's
    own). Thread-safe."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._entries: collections.deque[tuple[SpoolEntry, float]] = collections.deque()
        self.latencies: dict[int, float] = {}  # last_seq -> s from put to ack
        self.bytes = 0  # unacked

    def put(self, last_seq: int, data: bytes, at: float) -> None:
        with self._cond:
            self._entries.append((SpoolEntry(last_seq, data), at))
            self.bytes += len(data)
            self._cond.notify_all()

    def entries_after(self, seq: int, limit: int) -> list[SpoolEntry]:
        with self._cond:
            out = [e for e, _ in self._entries if e.last_seq > seq]
            return out[:limit]

    def ack(self, durable_seq: int) -> None:
        now = time.monotonic()
        with self._cond:
            while self._entries and self._entries[0][0].last_seq <= durable_seq:
                e, at = self._entries.popleft()
                self.latencies[e.last_seq] = now - at
                self.bytes -= len(e.data)
            self._cond.notify_all()

    def wait(self, after_seq: int, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(
                lambda: bool(self._entries) and self._entries[-1][0].last_seq > after_seq, timeout
            )


def serve_cloud(kind: str, robots: int) -> None:
    """The cloud process: comms server + replay buffer sink, ``robots`` enrolled robots."""
    import logging

    logging.disable(logging.WARNING)
    from buffer import BufferSettings, ReplayBuffer
    from buffer.table.ack_phases import PHASES
    from comms.bench.common import RUN, start_cloud
    from comms.cloud.replay_buffer_sink import ReplayBufferSink

    with tempfile.TemporaryDirectory(prefix="robofleet-bench-fleet-") as tmp:
        settings = BufferSettings(memory_budget_bytes=256 * 1024**2)
        buf = ReplayBuffer.open(Path(tmp) / "buffer", schema(kind), settings)
        cloud = start_cloud(ReplayBufferSink(buf), max_concurrent_streams=4 * robots + 64)
        creds = cloud.robots(robots)
        info = {"address": cloud.server.address, "robots": creds, "run": RUN}
        print(json.dumps(info), flush=True)
        sys.stdin.read()
        rows, stats = len(buf), buf.stats()
        cloud.close()
        buf.close()
    out = {"rows": rows, "fsyncs": stats["wal_fsyncs"]}
    out |= {k: stats[k] for k in ("appends", "merged_appends")}
    out |= {k: stats[f"ack_{k}_ms"] for k in PHASES}  # the buffer's append, by phase
    print(json.dumps(out), flush=True)


def serve_sharded_cloud(
    kind: str, robots: int, shards: int, ray_address: str, host: str, root: str
) -> None:
    """The cloud process across hosts: ``shards`` buffer shards (Ray actors on the nodes that
    offer :data:`SHARD_RESOURCE`, each with its ingest endpoint on its node's address) under
    ``root``, the comms server on ``host`` answering the robots' route calls, ``robots``
    enrolled robots. Prints the robots' credentials and the shards' pids and addresses as one
    JSON line, serves until stdin closes, then prints the shards' figures."""
    import logging

    logging.disable(logging.WARNING)
    import ray

    from buffer import BufferSettings
    from buffer.service.shard_client import ShardActors
    from comms.bench.common import RUN, start_cloud
    from comms.cloud.replay_buffer_sink import ReplayBufferSink
    from comms.cloud.shard_ingest import ShardIngest
    from comms.cloud.shard_routes import ShardRoutes
    from comms.config import CommsSettings
    from comms.wire import tickets

    ray.init(address=ray_address, logging_level=logging.ERROR, log_to_driver=False)
    streams = 4 * robots + 64
    comms = CommsSettings(bind_host=host, max_concurrent_streams=streams)
    key = tickets.new_key()
    settings = BufferSettings(
        memory_budget_bytes=SHARD_BUDGET_BYTES * shards, shard_resource=SHARD_RESOURCE
    )
    buf = ShardActors.start(
        Path(root),
        shards,
        schema(kind),
        settings,
        ["reach-v3"],
        max_restarts=0,
        # A private bridge between the bench's namespaces: plaintext, as the run's
        # ``insecure_network`` allows.
        endpoint=ShardIngest(comms, RUN, key, insecure_network=True),
    )
    routes = ShardRoutes(
        RUN, key, shards, lambda: [str(e["address"]) if e else "" for e in buf.endpoints]
    )
    cloud = start_cloud(
        ReplayBufferSink(buf),  # type: ignore[arg-type]  # the shards: the same calls
        routes=lambda run: routes if run == RUN else None,
        bind_host=host,
        max_concurrent_streams=streams,
    )
    creds = cloud.robots(robots)
    ends = [e or {} for e in buf.endpoints]
    info = {
        "address": cloud.server.address,
        "robots": creds,
        "run": RUN,
        "shard_pids": list(buf.pids),
        "shard_addresses": [str(e.get("address", "")) for e in ends],
    }
    print(json.dumps(info), flush=True)
    sys.stdin.read()
    figures = buf.refresh()
    stats = buf.stats()
    out: dict[str, Any] = {
        "cloud_rows": int(cloud.server.uploaded_rows(RUN)),
        "shard_rows": [int((f["endpoint"] or {}).get("rows", 0)) for f in figures],
        "shard_sizes": [int(f["size"]) for f in figures],
        "data_plane_batches": [
            int((f["endpoint"] or {}).get("data_plane_batches", 0)) for f in figures
        ],
        "fsyncs": stats["wal_fsyncs"],
        "appends": stats["appends"],
        "merged_appends": stats["merged_appends"],
    }
    cloud.close()
    buf.close()
    print(json.dumps(out), flush=True)


def drive(
    address: str,
    robots: list[tuple[int, str]],
    kind: str,
    batch_steps: int,
    hz: float,
    sharded: bool = False,
) -> None:
    """A driver process: connect an uplink per robot, print ``ready``, then replay steps from
    the start time (wall clock) read on stdin for the measured window; print the figures.
    ``sharded``: each robot asks the cloud for its shard's route and uploads there."""
    import logging

    logging.disable(logging.WARNING)
    from comms.bench.common import RUN
    from comms.config import CommsSettings
    from comms.robot.client import EdgeClient, make_channel
    from comms.robot.shard_route import ShardRouter
    from comms.robot.uploader import Uploader
    from comms.wire.steps import encode_batch

    s = CommsSettings()
    clients = [EdgeClient(make_channel(address, s), cred, s, address=address) for _, cred in robots]
    spools = [TimedSpool() for _ in robots]
    routers = [
        ShardRouter(c, RUN, rid) if sharded else None
        for c, (rid, _) in zip(clients, robots, strict=True)
    ]
    ups = [
        Uploader(c, RUN, sp, router) for c, sp, router in zip(clients, spools, routers, strict=True)
    ]
    templates = recording(kind, batch_steps, RUN)
    print("ready", flush=True)
    start_wall, warmup, seconds, drain = json.loads(sys.stdin.readline())
    t0 = time.monotonic() + (start_wall - time.time())
    window = (t0 + warmup, t0 + warmup + seconds)
    replay = _Replay(robots, spools, templates, batch_steps / hz, encode_batch)
    replay.run(t0, window[1])
    deadline = time.monotonic() + drain
    while time.monotonic() < deadline and any(sp.bytes for sp in spools):
        time.sleep(0.05)
    out = replay.figures(window, ups)
    out["shard_streams"] = sum(r.shard_streams for r in routers if r is not None)
    out["route_asks"] = sum(r.asked for r in routers if r is not None)
    print(json.dumps(out), flush=True)
    for u in ups:
        u.close()
    for c in clients:
        c.close()


class _Replay:
    """Spools each robot's next batch every ``period`` s (robots evenly phased)."""

    def __init__(
        self,
        robots: list[tuple[int, str]],
        spools: list[TimedSpool],
        templates: list[pa.RecordBatch],
        period: float,
        encode: Any,
    ) -> None:
        self.robots, self.spools, self.templates = robots, spools, templates
        self.period, self.encode = period, encode
        # per robot: last_seq -> (monotonic s of its put, its bytes)
        self.put_at: list[dict[int, tuple[float, int]]] = [{} for _ in robots]
        self.skipped = 0  # batches not produced: the driver's spool cap was reached
        self.late_s = 0.0  # the most a put came after its schedule (the driver fell behind)

    def run(self, t0: float, end: float) -> None:
        n = len(self.robots)
        heap = [(t0 + self.period * i / n, i, 0) for i in range(n)]
        heapq.heapify(heap)
        while heap:
            due, i, k = heapq.heappop(heap)
            if due >= end:
                continue
            now = time.monotonic()
            if due > now:
                time.sleep(due - now)
            self.late_s = max(self.late_s, time.monotonic() - due)
            self._put(i, k)
            heapq.heappush(heap, (due + self.period, i, k + 1))

    def _put(self, i: int, k: int) -> None:
        spool = self.spools[i]
        if sum(sp.bytes for sp in self.spools) > SPOOL_CAP_BYTES:
            self.skipped += 1
            return
        tpl = self.templates[k % len(self.templates)]
        first = k * tpl.num_rows
        data = self.encode(stamp(tpl, self.robots[i][0], first))
        last = first + tpl.num_rows - 1
        at = time.monotonic()
        self.put_at[i][last] = (at, len(data))
        spool.put(last, data, at)

    def figures(self, window: tuple[float, float], ups: list[Any]) -> dict[str, Any]:
        """Latencies (s) of the batches spooled in ``window``; the window's unacked ones."""
        lat: list[float] = []
        unacked = acked_bytes = 0
        for puts, sp in zip(self.put_at, self.spools, strict=True):
            for last, (at, nbytes) in puts.items():
                if window[0] <= at < window[1]:
                    got = sp.latencies.get(last)
                    if got is None:
                        unacked += 1
                    else:
                        lat.append(got)
                        acked_bytes += nbytes
        return {
            "latencies": lat,
            "unacked": unacked,
            "acked_bytes": acked_bytes,
            "backpressure": sum(u.backpressured for u in ups),
            "skipped": self.skipped,
            "late_s": self.late_s,
        }
