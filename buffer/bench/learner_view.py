"""The learner's view of a sharded buffer (``robofleet bench buffer --learner-view``).

For each shard count k (1, 2 and 4 by default): k ``BufferShard`` Ray actors started by
``ShardActors.start``, as a run with ``buffer.shards: k`` starts them (each its own WAL,
segments and batch server, the run's buffer settings split across them); robots recording
camera steps (two 128x128x3 cameras and the state, ~98 KB) into their shards through
``ShardActors.append`` (Arrow IPC to the shard, acknowledged after its fdatasync) at a steady
rate; and a learner drawing batches of 256 with ``ShardedRemoteBuffer`` (prefetch on, the SAC
layout: both cameras and their next frames, ~50 MB a batch; the shards write each batch into
the learner's shared memory, ``buffer.service.shm_batches``) in two phases, ``rounds`` times:

* full speed: ``sample`` back to back; batches/s and MB/s delivered: the data rate ceiling.
* at the learner's rate: each ``sample`` is followed by a simulated update of
  ``1 / learner_hz`` s (a sleep: a GPU update leaves the CPU to the prefetch thread); the
  wait fraction is the time inside ``sample`` (blocked on the next batch) over the phase's
  wall time.

The same phases follow in each round with a second learner client that takes every batch over
the socket (``shared_memory=False``: ZeroMQ frames on TCP loopback, as from shards on other
nodes): keys ``learner_socket_*``.

Baseline: a numpy fancy-index gather of the same columns from the frames the robots wrote
before the learner started, held as contiguous arrays in one process
(``buffer.bench.sample.numpy_gather``), timed before any shard starts; ratio = gather time per
batch / our time per batch at full speed. Figures are medians over the rounds.

Run alone: ``python -m buffer.bench.learner_view [--quick] [--learner-hz HZ]`` prints its
table and one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from buffer.bench.data import ROBOT_CAMERAS, bench_schema, make_batches
from buffer.bench.ingest import run_threads
from buffer.bench.sample import BATCH, contiguous_columns, numpy_gather, time_calls
from buffer.config import BufferSettings
from buffer.errors import BackpressureError
from buffer.service.shard_client import ShardActors
from buffer.service.sharded_batches import ShardedRemoteBuffer
from buffer.service.shards import shard_of
from buffer.table.schema import StepSchema

TASKS = ["reach-v3"]  # the task ``buffer.bench.data`` steps carry
OBJECT_STORE_BYTES = 512 * 1024**2  # Ray's object store: appends in flight (~1.6 MB each)


@dataclass(frozen=True)
class ViewConfig:
    """The sizes of one learner-view measurement.

    Attributes:
        shard_counts: the shard counts measured, one after another.
        robots: robots recording (:func:`robot_names`: as many in every shard).
        chunk: steps per append (one upload of a robot).
        robot_hz: steps per second each robot records while the learner samples.
        prefill_chunks: appends of each robot before the learner starts.
        batch: rows per learner batch.
        learner_hz: the learner's update rate (updates/s): a simulated update takes
            ``1 / learner_hz`` s.
        seconds: length of each phase (s).
        rounds: full-speed and learner-rate phase pairs per shard count (medians reported).
        cameras: the steps' cameras (name -> HWC shape).
        settings: the run's buffer settings, split across the shards as a run splits them.
        timeout_s: the longest wait for one shard's reply (s).
    """

    shard_counts: tuple[int, ...] = (1, 2, 4)
    robots: int = 8
    chunk: int = 16
    robot_hz: float = 20.0
    prefill_chunks: int = 16
    batch: int = BATCH
    learner_hz: float = 20.0
    seconds: float = 4.0
    rounds: int = 3
    cameras: dict[str, tuple[int, int, int]] = field(default_factory=lambda: dict(ROBOT_CAMERAS))
    settings: BufferSettings = field(default_factory=BufferSettings)
    timeout_s: float = 60.0


QUICK = ViewConfig(prefill_chunks=4, seconds=1.5, rounds=1)


def robot_names(robots: int, shard_counts: Sequence[int]) -> list[str]:
    """``robots`` names ``robot-<i>`` (lowest ``i`` first) that ``shard_of`` spreads evenly
    over every count in ``shard_counts`` (at most ``ceil(robots / k)`` in a shard of ``k``), so
    no shard idles for want of robots. ``robot-0`` to ``robot-7`` for 8 robots and 1, 2, 4
    shards.

    Raises:
        ValueError: no such names among the first 100,000.
    """
    names: list[str] = []
    for i in range(100_000):
        if len(names) == robots:
            return names
        name = f"robot-{i}"
        if all(
            sum(shard_of(n, k) == shard_of(name, k) for n in names) < -(-robots // k)
            for k in shard_counts
        ):
            names.append(name)
    raise ValueError(f"no {robots} robot names spread evenly over {list(shard_counts)} shards")


def learner_layout(schema: StepSchema) -> dict[str, Any]:
    """What each row of the learner's batches carries (``RunPlan.batch_layout`` of an
    algorithm that needs next observations, SAC's): every camera and its next frame."""
    cams = [k for k, f in schema.observations.items() if f.is_image]
    return {"images": cams, "chunk": 1, "next_images": True}


@contextmanager
def local_ray() -> Iterator[None]:
    """A Ray of this machine on loopback for the shard actors (the one already initialised,
    if any, is used and left running)."""
    import ray

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    if ray.is_initialized():
        yield
        return
    ray.init(
        num_cpus=1,
        include_dashboard=False,
        log_to_driver=False,
        _node_ip_address="127.0.0.1",
        object_store_memory=OBJECT_STORE_BYTES,
    )
    try:
        yield
    finally:
        ray.shutdown()


class Robots:
    """Robots recording into a run's shards through ``ShardActors.append``.

    :meth:`prefill` appends given batches as fast as the shards take them (one thread per
    robot); :meth:`start` then has every robot record ``robot_hz`` steps/s (an append of
    ``chunk`` fresh steps every ``chunk / robot_hz`` s, seqs following the prefill's) until
    :meth:`stop`. A refused append (``BackpressureError``) is sent again after the refusal's
    wait, as a robot's spool does.
    """

    def __init__(
        self, shards: ShardActors, schema: StepSchema, names: Sequence[str], cfg: ViewConfig
    ) -> None:
        self.shards = shards
        self.schema = schema
        self.names = list(names)
        self.cfg = cfg
        self.rows = 0  # rows acknowledged since :meth:`start`
        self.errors: list[BaseException] = []
        self._next_seq = dict.fromkeys(self.names, 0)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def _append(self, batch: pa.RecordBatch) -> bool:
        """Append ``batch``, sent again while its shard refuses; False: given up at
        :meth:`halt`.

        Raises:
            TimeoutError: the shard refused it for ``cfg.timeout_s``.
        """
        deadline = time.monotonic() + self.cfg.timeout_s
        while True:
            try:
                self.shards.append(batch)
                return True
            except BackpressureError as exc:
                if time.monotonic() > deadline:
                    msg = f"a shard refused appends for {self.cfg.timeout_s} s"
                    raise TimeoutError(msg) from exc
                if self._stop.wait(exc.retry_after_s):
                    return False

    def prefill(self, per_robot: Sequence[Sequence[pa.RecordBatch]]) -> None:
        """Append each robot's batches (robot ``i``: ``per_robot[i]``, seqs from 0).

        Raises:
            RuntimeError: a robot's append failed (its error chained).
        """

        def one(name: str, batches: Sequence[pa.RecordBatch]) -> None:
            try:
                for b in batches:
                    if not self._append(b):
                        return
                    self._next_seq[name] += b.num_rows
            except BaseException as exc:  # raised below, in the caller's thread
                self.errors.append(exc)

        run_threads(
            [lambda n=n, bs=bs: one(n, bs) for n, bs in zip(self.names, per_robot, strict=True)]
        )
        self._raise_errors()

    def start(self) -> None:
        for i, name in enumerate(self.names):
            t = threading.Thread(target=self._record, args=(name, i), name=f"robot-{i}")
            t.start()
            self._threads.append(t)

    def _record(self, name: str, i: int) -> None:
        rng = np.random.default_rng(1000 + i)
        period = self.cfg.chunk / self.cfg.robot_hz
        due = time.monotonic() + period * i / len(self.names)  # robots out of step
        try:
            while not self._stop.wait(max(0.0, due - time.monotonic())):
                seq0 = self._next_seq[name]
                (b,) = make_batches(self.schema, name, 1, rng, self.cfg.chunk, seq0=seq0)
                if not self._append(b):
                    return
                self._next_seq[name] += b.num_rows
                with self._lock:
                    self.rows += b.num_rows
                due = max(due + period, time.monotonic() - period)
        except BaseException as exc:  # reported by stop(): the figures would be wrong
            self.errors.append(exc)

    def halt(self) -> None:
        """Stop recording and wait for the robots' last appends (again: nothing)."""
        self._stop.set()
        for t in self._threads:
            t.join(self.cfg.timeout_s)
        self._threads.clear()

    def stop(self) -> None:
        """:meth:`halt`, then report a failed append.

        Raises:
            RuntimeError: a robot's append failed (its error chained).
        """
        self.halt()
        self._raise_errors()

    def _raise_errors(self) -> None:
        if self.errors:
            raise RuntimeError("a robot's append failed") from self.errors[0]


@dataclass
class _Draws:
    """What the learner drew in one phase."""

    batches: int = 0
    bytes: int = 0
    waited_s: float = 0.0
    wall_s: float = 0.0
    waits: list[float] = field(default_factory=list)


def _phase(
    remote: ShardedRemoteBuffer,
    cfg: ViewConfig,
    update_s: float,
    per_shard: np.ndarray,
    seconds: float,
) -> _Draws:
    """``sample`` calls for ``seconds``, each followed by a sleep of ``update_s`` (the
    simulated update, outside the timed call); rows drawn from each shard are added to
    ``per_shard``."""
    d = _Draws()
    t_start = time.perf_counter()
    t_end = t_start + seconds
    while time.perf_counter() < t_end:
        t = time.perf_counter()
        batch = remote.sample(cfg.batch)
        waited = time.perf_counter() - t
        d.waited_s += waited
        d.waits.append(waited)
        d.batches += 1
        d.bytes += sum(v.nbytes for v in batch.values())
        per_shard += np.bincount(batch["shard"], minlength=len(per_shard))
        if update_s > 0:
            time.sleep(update_s)
    d.wall_s = time.perf_counter() - t_start
    return d


def measure_shards(
    root: Path,
    shards: int,
    cfg: ViewConfig,
    prefill: Sequence[Sequence[pa.RecordBatch]],
    gather_s: float,
) -> dict[str, float]:
    """The learner's view of ``shards`` shard actors under ``root`` (removed after), the
    robots having appended ``prefill`` (one list per robot) first; keys end in
    ``_<shards>``. ``gather_s``: the baseline's seconds per batch. Needs ``ray.init`` done.

    Keys: ``learner_batches_per_s`` / ``learner_mb_per_s`` / ``learner_ms_per_batch`` (full
    speed), ``learner_ratio_vs_gather``, ``learner_wait_fraction`` and
    ``learner_updates_per_s`` (at ``cfg.learner_hz``), the same five of the socket client
    as ``learner_socket_*``, ``learner_slot_share`` (of the shared-memory client's batches,
    those that arrived in a slot), ``learner_wait_p50_ms`` /
    ``learner_wait_p99_ms`` (per ``sample`` call at that rate), ``learner_robot_steps_per_s``
    (acknowledged while the learner sampled), ``learner_rows`` (in the shards at the end) and
    ``learner_share_dev`` (largest difference between a shard's share of the rows drawn and
    its share of the rows held, 0..1).

    Raises:
        RuntimeError: a robot's append failed.
    """
    schema = bench_schema(cfg.cameras)
    actors = ShardActors.start(root, shards, schema, cfg.settings, TASKS)
    names = robot_names(cfg.robots, cfg.shard_counts)
    robots = Robots(actors, schema, names, cfg)
    remote: ShardedRemoteBuffer | None = None
    socket: ShardedRemoteBuffer | None = None
    try:
        robots.prefill(prefill)
        robots.start()
        t_writing = time.perf_counter()
        layout = learner_layout(schema)
        remote = ShardedRemoteBuffer(
            actors.addresses,
            cfg.timeout_s,
            layout,
            seed=shards,
            prefetch=True,
            token=actors.token,
        )
        socket = ShardedRemoteBuffer(
            actors.addresses,
            cfg.timeout_s,
            layout,
            seed=shards,
            prefetch=True,
            shared_memory=False,
            token=actors.token,
        )
        per_shard = np.zeros(shards, dtype=np.int64)
        # Warm up: sockets connected, slots made, sealed segments promoted into the hot tiers.
        _phase(remote, cfg, 0.0, per_shard, min(cfg.seconds, 1.0))
        _phase(socket, cfg, 0.0, per_shard, min(cfg.seconds, 1.0))
        slotted = remote.slot_batches
        full: list[_Draws] = []
        paced: list[_Draws] = []
        sfull: list[_Draws] = []
        spaced: list[_Draws] = []
        for _ in range(cfg.rounds):
            full.append(_phase(remote, cfg, 0.0, per_shard, cfg.seconds))
            paced.append(_phase(remote, cfg, 1.0 / cfg.learner_hz, per_shard, cfg.seconds))
            sfull.append(_phase(socket, cfg, 0.0, per_shard, cfg.seconds))
            spaced.append(_phase(socket, cfg, 1.0 / cfg.learner_hz, per_shard, cfg.seconds))
        in_slots = (remote.slot_batches - slotted) / max(1, sum(d.batches for d in (*full, *paced)))
        rows_written = robots.rows
        writing_s = time.perf_counter() - t_writing
        robots.stop()
        sizes = np.array([int(f["size"]) for f in actors.refresh()], dtype=np.float64)
    finally:
        robots.halt()
        for r in (remote, socket):
            if r is not None:
                r.close()
        actors.close()
        shutil.rmtree(root, ignore_errors=True)
    ms_per_batch = float(np.median([d.wall_s / d.batches for d in full])) * 1e3
    waits = [w for d in paced for w in d.waits]
    drawn = per_shard / max(per_shard.sum(), 1)
    held = sizes / max(sizes.sum(), 1.0)
    out = {
        "learner_batches_per_s": float(np.median([d.batches / d.wall_s for d in full])),
        "learner_mb_per_s": float(np.median([d.bytes / d.wall_s / 1e6 for d in full])),
        "learner_ms_per_batch": ms_per_batch,
        "learner_ratio_vs_gather": gather_s * 1e3 / ms_per_batch,
        "learner_wait_fraction": float(np.median([d.waited_s / d.wall_s for d in paced])),
        "learner_updates_per_s": float(np.median([d.batches / d.wall_s for d in paced])),
        "learner_wait_p50_ms": float(np.percentile(waits, 50) * 1e3),
        "learner_wait_p99_ms": float(np.percentile(waits, 99) * 1e3),
        "learner_robot_steps_per_s": rows_written / writing_s,
        "learner_rows": float(sizes.sum()),
        "learner_share_dev": float(np.abs(drawn - held).max()),
        "learner_slot_share": min(1.0, in_slots),
        "learner_socket_ms_per_batch": float(np.median([d.wall_s / d.batches for d in sfull]))
        * 1e3,
        "learner_socket_batches_per_s": float(np.median([d.batches / d.wall_s for d in sfull])),
        "learner_socket_wait_fraction": float(np.median([d.waited_s / d.wall_s for d in spaced])),
        "learner_socket_updates_per_s": float(np.median([d.batches / d.wall_s for d in spaced])),
    }
    out["learner_socket_ratio_vs_gather"] = gather_s * 1e3 / out["learner_socket_ms_per_batch"]
    return {f"{k}_{shards}": v for k, v in out.items()}


def gather_baseline(
    schema: StepSchema, per_robot: Sequence[Sequence[pa.RecordBatch]], cfg: ViewConfig
) -> float:
    """Seconds per batch of the numpy gather of the same columns from the robots' frames
    (contiguous arrays in this process)."""
    arrays, scalars = contiguous_columns(schema, [list(bs) for bs in per_robot])
    rng = np.random.default_rng(0)
    return time_calls(lambda: numpy_gather(schema, arrays, scalars, rng, cfg.batch), cfg.seconds)


def bench_learner_view(root: Path, cfg: ViewConfig) -> dict[str, float]:
    """The learner's view for every shard count of ``cfg`` (keys: :func:`measure_shards`
    with the count appended, plus ``learner_hz``, ``learner_batch_mb`` and
    ``learner_gather_ms``); starts a local Ray unless one is running.

    Raises:
        RuntimeError: a robot's append failed.
    """
    schema = bench_schema(cfg.cameras)
    rng = np.random.default_rng(7)
    prefill = [
        make_batches(schema, name, cfg.prefill_chunks, rng, cfg.chunk)
        for name in robot_names(cfg.robots, cfg.shard_counts)
    ]
    gather_s = gather_baseline(schema, prefill, cfg)
    out: dict[str, float] = {
        "learner_hz": cfg.learner_hz,
        "learner_batch_rows": float(cfg.batch),
        "learner_robots": float(cfg.robots),
        "learner_robot_hz": cfg.robot_hz,
        "learner_gather_ms": gather_s * 1e3,
    }
    with local_ray():
        for k in cfg.shard_counts:
            out.update(measure_shards(root / f"learner-{k}", k, cfg, prefill, gather_s))
    k0 = cfg.shard_counts[0]
    out["learner_batch_mb"] = out[f"learner_mb_per_s_{k0}"] / out[f"learner_batches_per_s_{k0}"]
    return out


def config_from(args: argparse.Namespace, quick: bool) -> ViewConfig:
    """The measurement's sizes from the command line (``--quick``, ``--learner-hz``,
    ``--learner-shards``)."""
    cfg = QUICK if quick else ViewConfig()
    counts = tuple(int(s) for s in str(args.learner_shards).split(",") if s)
    return replace(cfg, learner_hz=float(args.learner_hz), shard_counts=counts)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--learner-hz`` and ``--learner-shards`` (shared with ``robofleet bench buffer``)."""
    parser.add_argument(
        "--learner-hz",
        type=float,
        default=ViewConfig.learner_hz,
        help="the learner's update rate: each update takes 1/HZ s (default %(default)s)",
    )
    parser.add_argument(
        "--learner-shards",
        default="1,2,4",
        help="shard counts the learner view measures, comma-separated (default %(default)s)",
    )


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m buffer.bench.learner_view")
    parser.add_argument("--quick", action="store_true", help="smaller, shorter run")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    parser.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    add_arguments(parser)
    args = parser.parse_args(list(argv))
    cfg = config_from(args, args.quick)
    root = Path(tempfile.mkdtemp(prefix="bench-learner-", dir=args.dir))
    try:
        r = bench_learner_view(root, cfg)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if not args.json:
        from buffer.bench.report import print_learner_table

        print_learner_table(r, cfg.shard_counts)
    sys.stdout.flush()
    print(json.dumps({k: round(v, 4) for k, v in r.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
