"""A run's buffer split into shards, past what one buffer process ingests.

Each robot belongs to exactly one shard, ``shard_of(robot_id, n)`` (CRC-32 of the id, so every
process and node agrees), and each shard is a whole :class:`ReplayBuffer` in its own
directory (``<root>/shard-<k>``) with its own WAL, segments, row index and memory budget. So
every contract of the buffer holds per robot unchanged: an append is acknowledged after the
fdatasync of the shard holding its robot, duplicates are recognised there (a retry lands in
the same shard), a robot's seqs and episodes never span shards, and reopening recovers each
shard on its own. ``<root>/shards.json`` records the count; opening with another count is
refused (robots would move).

A learner samples across shards in proportion to their size: a batch of B draws its rows per
shard from a multinomial with the shards' transition counts as weights, so every stored
transition is equally likely whichever shard holds it (as in one buffer), and each shard's
sampler picks within it.

Two ways to run them:

* one process: :class:`ShardedBuffer` holds the shards side by side (appends routed by
  robot, sampling across them); ``bench buffer --shards`` and the tests use it.
* one process per shard, on any node: ``buffer.service.shard_actor.BufferShard`` as Ray actors, each
  with its shard directory on its node's disk and its own :class:`buffer.service.batches.BatchServer`;
  uploads are routed by ``shard_of``, and the learner's
  ``buffer.service.sharded_batches.ShardedRemoteBuffer`` samples across their servers in proportion to their
  sizes (``docs/architecture.md``, "Past one buffer process").

A run with ``buffer.shards`` above 1 runs its shards as Ray actors
(``buffer.service.shard_client.ShardActors``: ``docs/architecture.md``, "Past one buffer
process").
"""

from __future__ import annotations

import copy
import json
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import ArrayLike, NDArray

from buffer.config import BufferSettings
from buffer.errors import NothingToSample
from buffer.sampling.samplers import Sampler
from buffer.table.claim import AppendResult
from buffer.table.opening import SCHEMA_FILE, SHARDS_FILE
from buffer.table.reading import sample_across_shards
from buffer.table.replay_buffer import ReplayBuffer
from buffer.table.schema import StepSchema
from foundation.durable import atomic_write_text
from foundation.rows import RowFilter


def shard_of(robot_id: str | int, shards: int) -> int:
    """The shard of ``robot_id`` (compared as the buffer's ``robot_id`` string) among
    ``shards``: CRC-32 of its UTF-8 bytes modulo ``shards``, the same in every process."""
    return zlib.crc32(str(robot_id).encode()) % shards


def shard_settings(settings: BufferSettings, shards: int) -> BufferSettings:
    """``settings`` for one of ``shards`` shards: the memory budget and the byte and
    transition limits (capacity, retention) split equally, so the shards together keep the
    buffer's; a limit of 0 (none) stays 0."""

    def part(v: int) -> int:
        return max(v // shards, 1) if v else 0

    return settings.model_copy(
        update={
            "memory_budget_bytes": max(settings.memory_budget_bytes // shards, 1),
            "capacity_transitions": part(settings.capacity_transitions),
            "capacity_bytes": part(settings.capacity_bytes),
            "retention_max_bytes": part(settings.retention_max_bytes),
        }
    )


def split_by_shard(records: pa.RecordBatch | pa.Table, shards: int) -> list[tuple[int, Any]]:
    """``(shard, rows of records in it)`` for each of the ``shards`` holding a robot of
    ``records``, rows keeping their order (rows without ``robot_id``: all to shard 0, whose
    validation names what is wrong)."""
    if records.num_rows == 0 or "robot_id" not in records.schema.names:
        return [(0, records)]
    robots = records.column("robot_id")
    distinct = pc.unique(robots).to_pylist()
    found = {shard_of(r, shards) for r in distinct}
    if len(found) == 1:
        return [(found.pop(), records)]
    key = np.array([shard_of(r, shards) for r in robots.to_pylist()])
    return [(k, records.filter(pa.array(key == k))) for k in sorted(found)]


def shard_dir(root: str | Path, k: int) -> Path:
    return Path(root) / f"shard-{k:02d}"


def shard_count(root: str | Path, shards: int | None = None) -> int:
    """The shard count of ``root``: the one recorded there, else ``shards`` (recorded now,
    durably, when given).

    Raises:
        ValueError: ``shards`` differs from the recorded count (robots would move between
            shards), is below 1, or neither is known.
    """
    path = Path(root) / SHARDS_FILE
    if path.exists():
        stored = int(json.loads(path.read_text())["shards"])
        if shards is not None and shards != stored:
            raise ValueError(
                f"{root} holds {stored} buffer shards, not {shards}: robots would change "
                "shards (resharding is not supported)"
            )
        return stored
    if shards is None or shards < 1:
        raise ValueError(f"{root}: no {SHARDS_FILE} and no valid shard count ({shards})")
    Path(root).mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps({"shards": shards}))
    return shards


def merge_stats(
    each: Sequence[Mapping[str, float | int]], hits: Sequence[int], misses: Sequence[int]
) -> dict[str, float | int]:
    """One buffer's ``ReplayBuffer.stats`` from its shards' (``each``, shard ``k`` at ``k``,
    with the hits and misses of each shard's cache): counts and bytes summed, the cache hit
    rate weighted by samples served, latencies the worst shard's; plus ``shards``."""
    out: dict[str, float | int] = {}
    for key in each[0]:
        values = [e[key] for e in each]
        if key.startswith(("ack_latency", "prefetch_lag", "recovery_seconds")):
            out[key] = max(values)
        elif key != "cache_hit_rate":
            out[key] = sum(values)
    served = sum(hits) + sum(misses)
    out["cache_hit_rate"] = sum(hits) / served if served else 1.0
    out["shards"] = len(each)
    return out


class ShardedBuffer:
    """Shards of one buffer in this process (see the module docstring). The part of
    :class:`ReplayBuffer`'s surface a run uses: ``append``, ``sample``, ``len``,
    ``select`` (to count), the per-robot lookups, ``mark_episode``, ``stats``, ``close``.

    Args:
        root: the directory holding ``shard-<k>`` directories and ``shards.json``.
        shards: the open shards, shard ``k`` at position ``k``.
    """

    def __init__(self, root: Path, shards: Sequence[ReplayBuffer]) -> None:
        self.root = root
        self.shards = list(shards)
        self.schema = self.shards[0].schema
        self._samplers: dict[int, tuple[Sampler, list[Sampler]]] = {}

    @classmethod
    def open(
        cls,
        root: str | Path,
        schema: StepSchema | None = None,
        settings: BufferSettings | None = None,
        *,
        shards: int | None = None,
        read_only: bool = False,
    ) -> ShardedBuffer:
        """Open (creating or recovering) every shard of ``root``: ``shards`` of them, or as
        many as ``root`` records (``shards`` None); each shard gets an equal part of the
        memory budget and limits (:func:`shard_settings`), so the shards keep the buffer's.

        Raises:
            ValueError: another count than the recorded one, none for a new directory, or a
                schema that differs; and whatever :meth:`ReplayBuffer.open` raises for a shard
                (the shards opened before it are closed again).
        """
        settings = settings or BufferSettings()
        n = shard_count(root, None if read_only else shards)
        part = shard_settings(settings, n)
        opened: list[ReplayBuffer] = []
        try:
            for k in range(n):
                opened.append(
                    ReplayBuffer.open(shard_dir(root, k), schema, part, read_only=read_only)
                )
        except BaseException:
            for buf in opened:
                buf.close()
            raise
        if not read_only and not (Path(root) / SCHEMA_FILE).exists():
            # The run's schema beside the shards too: readers of the run directory (the
            # learner's dimensions) find it where a single buffer keeps it.
            atomic_write_text(Path(root) / SCHEMA_FILE, opened[0].schema.to_json())
        return cls(Path(root), opened)

    # ------------------------------------------------------------------ writing ------
    def shard_for(self, robot_id: str | int) -> ReplayBuffer:
        return self.shards[shard_of(robot_id, len(self.shards))]

    def append(
        self,
        records: pa.RecordBatch | pa.Table | Sequence[Mapping[str, Any]],
        *,
        timeout: float | None = None,
    ) -> AppendResult:
        """:meth:`ReplayBuffer.append` in the shard of each robot of ``records`` (a batch is
        usually one robot's: one shard, all-or-nothing as there). A batch of robots in
        several shards is appended shard by shard: when one part fails the parts before it
        are stored and acknowledged in their shards, and a retry of the whole batch stores
        nothing twice (each robot's duplicates are recognised in its shard).

        Returns:
            ``acked``, ``stored`` and ``duplicates`` over the parts; ``rows`` is the range in
            the shard of the first part.

        Raises:
            as :meth:`ReplayBuffer.append`.
        """
        if not isinstance(records, pa.RecordBatch | pa.Table):
            records = self.schema.batch_from_records(list(records))
        parts = self._split(records)
        results = [self.shards[k].append(part, timeout=timeout) for k, part in parts]
        if not results:
            return AppendResult({}, 0, 0, (0, 0))
        acked: dict[str, int] = {}
        for r in results:
            acked.update(r.acked)
        return AppendResult(
            acked,
            sum(r.stored for r in results),
            sum(r.duplicates for r in results),
            results[0].rows,
        )

    def _split(self, records: pa.RecordBatch | pa.Table) -> list[tuple[int, Any]]:
        return split_by_shard(records, len(self.shards))

    def mark_episode(
        self,
        robot_id: str | int,
        run_id: str,
        episode_index: int,
        kind: str = "discard",
        reason: str = "",
    ) -> int:
        """:meth:`ReplayBuffer.mark_episode` in the robot's shard."""
        shard = self.shard_for(robot_id)
        return shard.mark_episode(robot_id, run_id, episode_index, kind, reason)

    def can_accept(self, n: int = 1) -> bool:
        return all(s.can_accept(n) for s in self.shards)

    def flush(self) -> None:
        for s in self.shards:
            s.flush()

    # ------------------------------------------------------------------ lookups ------
    def durable_seq(self, robot_id: str | int) -> int | None:
        return self.shard_for(robot_id).durable_seq(robot_id)

    def stored_seqs(self, robot_id: str | int, *, retired: bool = True) -> NDArray[np.int64]:
        return self.shard_for(robot_id).stored_seqs(robot_id, retired=retired)

    def retired_seqs(self, robot_id: str | int) -> NDArray[np.int64]:
        return self.shard_for(robot_id).retired_seqs(robot_id)

    def contains(self, robot_id: str | int, seqs: ArrayLike) -> NDArray[np.bool_]:
        return self.shard_for(robot_id).contains(robot_id, seqs)

    def select(self, rows: RowFilter | None = None) -> np.ndarray:
        """Eligible rows that ``rows`` keeps (:meth:`ReplayBuffer.select`) of every shard,
        concatenated: row ids are per shard, so this is for counting."""
        return np.concatenate([s.select(rows) for s in self.shards])

    def __len__(self) -> int:
        return sum(len(s) for s in self.shards)

    @property
    def num_steps(self) -> int:
        return sum(s.num_steps for s in self.shards)

    # ------------------------------------------------------------------ sampling -----
    def sample(
        self,
        batch_size: int,
        sampler: Sampler | None = None,
        *,
        rng: np.random.Generator | None = None,
        timeout: float | None = None,
    ) -> dict[str, np.ndarray]:
        """``batch_size`` transitions across shards in proportion to their sizes (module
        docstring): :meth:`ReplayBuffer.sample`'s keys plus ``shard`` (int16); ``index`` is
        the row in that shard. A shard whose sampler finds nothing to draw (an intervention
        sampler in a shard without interventions) hands its share to the others.

        Raises:
            ValueError: nothing to sample in any shard.
        """
        rng = rng or np.random.default_rng()
        sizes = np.array([len(s) for s in self.shards], dtype=np.float64)

        def draw(counts: np.ndarray) -> list[tuple[int, dict[str, np.ndarray] | None]]:
            out: list[tuple[int, dict[str, np.ndarray] | None]] = []
            for k in np.flatnonzero(counts).tolist():
                try:
                    part = self.shards[k].sample(
                        int(counts[k]), self._sampler(sampler, k), rng=rng, timeout=timeout
                    )
                except NothingToSample:  # nothing this sampler can draw in shard k
                    part = None
                out.append((k, part))
            return out

        def nothing(barren: bool) -> None:
            raise NothingToSample("nothing to sample")

        return sample_across_shards(batch_size, sizes.copy, rng, draw, nothing)

    def _sampler(self, sampler: Sampler | None, k: int) -> Sampler | None:
        """Shard ``k``'s own copy of ``sampler`` (a sampler may keep per-buffer state)."""
        if sampler is None:
            return None
        entry = self._samplers.get(id(sampler))
        if entry is None or entry[0] is not sampler:
            entry = (sampler, [copy.deepcopy(sampler) for _ in self.shards])
            self._samplers[id(sampler)] = entry
        return entry[1][k]

    # ------------------------------------------------------------------ metrics ------
    def stats(self) -> dict[str, float | int]:
        """:meth:`ReplayBuffer.stats` over the shards: counts and bytes summed, the cache
        hit rate weighted by samples served, latencies the worst shard's; plus ``shards``."""
        return merge_stats(
            [s.stats() for s in self.shards],
            [s.storage.hits for s in self.shards],
            [s.storage.misses for s in self.shards],
        )

    def close(self) -> None:
        for s in self.shards:
            s.close()

    def __enter__(self) -> ShardedBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
