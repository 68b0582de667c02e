"""A run's buffer as Ray actors, seen from the cloud process: :class:`ShardActors`.

Each shard is a ``buffer.service.shard_actor.BufferShard`` actor (its own process, placed by
Ray on any node, restarted by Ray when its process dies: it recovers from its WAL). The cloud
keeps the part of ``ReplayBuffer``'s surface a run uses: appends routed to the robot's shard
(``shard_of``, so a robot stays in its shard across resumes), the per-robot lookups the upload
sink and the accounting ask, episode marks, counts and statistics over all shards. Only Arrow
IPC bytes and plain values cross to the actors.

A shard that does not answer (its process died and Ray is starting it again) refuses appends
and lookups with ``BackpressureError``: the robot keeps its steps in its spool and sends them
again, so nothing acknowledged depends on a shard that is away.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import ArrayLike, NDArray

from buffer.config import BufferSettings
from buffer.errors import BackpressureError
from buffer.service.batches import MixConfig
from buffer.service.shard_actor import (
    EndpointFactory,
    Mount,
    SamplerFactory,
    raise_append_error,
    start_shards,
)
from buffer.service.shards import merge_stats, shard_count, shard_dir, shard_of, split_by_shard
from buffer.table.claim import AppendResult
from buffer.table.schema import StepSchema
from foundation.rows import RowFilter

log = logging.getLogger(__name__)
RETRY_S = 1.0  # a robot's wait before it sends again to a shard that is away
FIGURES_TIMEOUT_S = 5.0  # the run's figures go on without a shard that is away
FIGURES_MAX_AGE_S = 0.5


def placement(settings: BufferSettings) -> dict[str, Any]:
    """The Ray actor options that place a shard on a node advertising
    ``settings.shard_resource`` (one unit each); none when it is empty."""
    name = settings.shard_resource
    return {"resources": {name: 1}} if name else {}


def most_shards_on_a_node(settings: BufferSettings, shards: int) -> int:
    """The most of a run's ``shards`` one node may host: all of them without
    ``settings.shard_resource`` (Ray may place them together), else the most units of it a
    live node advertises now, at most ``shards``; 0 when no live node advertises it yet (not
    knowable). Needs ``ray.init``."""
    name = settings.shard_resource
    if not name:
        return shards
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    return min(shards, max((int(n["Resources"].get(name, 0)) for n in nodes), default=0))


class ShardLost(RuntimeError):
    """A shard has not answered for longer than its restarts may take."""


@dataclass(frozen=True)
class MountedRows:
    """One offline mount, as every shard holds it (each shard mounts the same rows)."""

    name: str
    rows: int
    task_names: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return self.rows


class ShardActors:
    """The shards of one run's buffer as Ray actors (module docstring).

    Args:
        root: the buffer's directory (``shard-<k>`` below it).
        actors: the shards' actor handles, shard ``k`` at ``k``.
        schema: the run's step schema.
        timeout_s: longest wait for one shard's answer.
        on_event: ``(kind, data)`` for each shard process that changed (a restart).
        token: the batch token of the shards' batch servers (``ShardedRemoteBuffer`` over
            ``addresses`` needs it; :meth:`start` makes a fresh one).
    """

    def __init__(
        self,
        root: Path,
        actors: Sequence[Any],
        schema: StepSchema,
        timeout_s: float = 30.0,
        on_event: Callable[[str, dict[str, Any]], None] | None = None,
        *,
        token: str,
    ) -> None:
        self.root = root
        self.token = token
        self.actors = list(actors)
        self.schema = schema
        self.timeout_s = timeout_s
        self.on_event = on_event
        self.offline: list[MountedRows] = []
        self.addresses: list[str] = []
        self.endpoints: list[dict[str, Any] | None] = []  # each shard's endpoint figures
        self.pids: list[int] = []
        self._figures: list[dict[str, Any]] = []
        self._answered = [time.monotonic()] * len(self.actors)
        self._refreshed = float("-inf")

    @classmethod
    def start(
        cls,
        root: Path,
        shards: int,
        schema: StepSchema,
        settings: BufferSettings,
        tasks: Sequence[str],
        *,
        mounts: Sequence[Mount] = (),
        sampler_factory: SamplerFactory | None = None,
        mix: MixConfig | None = None,
        demonstration_robots: Iterable[str] = (),
        host: str | None = None,
        max_restarts: int = 20,
        on_event: Callable[[str, dict[str, Any]], None] | None = None,
        endpoint: EndpointFactory | None = None,
    ) -> ShardActors:
        """Start the ``shards`` actors (spread over the cluster's nodes, or over those that
        advertise ``settings.shard_resource`` when set, each restarted by Ray up to
        ``max_restarts`` times) and wait until every one has opened its shard; ``host``: where
        their batch servers listen (None: ``settings.shard_batch_host``); ``endpoint``: a
        service each shard starts beside its batch server (``BufferShard``). Their batch
        servers take a fresh batch token, ``token`` of the result.

        Raises:
            ValueError: ``shards`` differs from the count recorded under ``root``.
            ray.exceptions.RayActorError: a shard could not open (its reason).
        """
        import ray

        from buffer.service.batch_token import new_token
        from buffer.table.opening import SCHEMA_FILE
        from foundation.durable import atomic_write_text

        shard_count(root, shards)  # another count is refused before any shard starts
        token = new_token()  # the group's batch token: to its actors and its learner only
        if not (root / SCHEMA_FILE).exists():
            # The run's schema beside the shards: readers of the run directory (the learner's
            # dimensions) find it where a single buffer keeps it.
            atomic_write_text(root / SCHEMA_FILE, schema.to_json())
        actors = start_shards(
            root,
            shards,
            schema,
            settings,
            tasks,
            demonstration_robots=demonstration_robots,
            host=settings.shard_batch_host if host is None else host,
            actor_options={
                "max_restarts": max_restarts,
                "scheduling_strategy": "SPREAD",
                **placement(settings),
            },
            mounts=mounts,
            sampler_factory=sampler_factory,
            mix=mix,
            endpoint=endpoint,
            token=token,
        )
        out = cls(root, actors, schema, on_event=on_event, token=token)
        try:
            out.addresses = list(ray.get([a.address.remote() for a in actors]))
            out.refresh()
        except BaseException:
            out.close()
            raise
        first = out._figures[0]
        out.offline = [
            MountedRows(m[2], int(n), list(t))
            for m, n, t in zip(mounts, first["offline"], first["offline_tasks"], strict=True)
        ]
        return out

    # ------------------------------------------------------------------ calls ------
    def _get(self, k: int, ref: Any, timeout_s: float | None = None) -> Any:
        """The answer of shard ``k`` to ``ref``.

        Raises:
            BackpressureError: the shard did not answer (away: its process restarting).
        """
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        try:
            got = ray.get(ref, timeout=self.timeout_s if timeout_s is None else timeout_s)
        except (RayActorError, GetTimeoutError) as exc:
            raise BackpressureError(
                f"buffer shard {k} is away ({type(exc).__name__}); send again", RETRY_S
            ) from None
        self._answered[k] = time.monotonic()
        return got

    def _home(self, robot_id: str | int) -> int:
        return shard_of(robot_id, len(self.actors))

    # ------------------------------------------------------------------ writing ------
    def append(
        self,
        records: pa.RecordBatch | pa.Table,
        *,
        timeout: float | None = None,
    ) -> AppendResult:
        """``ReplayBuffer.append`` in the shard of each robot of ``records`` (parts in several
        shards: as ``ShardedBuffer.append``).

        Raises:
            as ``ReplayBuffer.append``; ``BackpressureError`` while a shard is away.
        """
        parts = split_by_shard(records, len(self.actors))
        refs = [(k, self.actors[k].append_ipc_result.remote(_ipc(p), timeout)) for k, p in parts]
        acked: dict[str, int] = {}
        stored = duplicates = 0
        for k, ref in refs:
            reply = self._get(k, ref)
            raise_append_error(reply, str(shard_dir(self.root, k)))
            acked.update(reply["acked"])
            stored += int(reply["stored"])
            duplicates += int(reply["duplicates"])
        return AppendResult(acked, stored, duplicates, (0, 0))

    def mark_episode(
        self,
        robot_id: str | int,
        run_id: str,
        episode_index: int,
        kind: str = "discard",
        reason: str = "",
    ) -> int:
        """``ReplayBuffer.mark_episode`` in the robot's shard."""
        k = self._home(robot_id)
        ref = self.actors[k].mark_episode.remote(str(robot_id), run_id, episode_index, kind, reason)
        return int(self._get(k, ref))

    # ------------------------------------------------------------------ lookups ------
    def durable_seq(self, robot_id: str | int) -> int | None:
        k = self._home(robot_id)
        got = self._get(k, self.actors[k].durable_seq.remote(str(robot_id)))
        return None if got is None else int(got)

    def _seqs(self, robot_id: str | int, asked: ArrayLike = ()) -> dict[str, np.ndarray]:
        k = self._home(robot_id)
        seqs = np.asarray(asked, dtype=np.int64)
        return dict(self._get(k, self.actors[k].seqs.remote(str(robot_id), seqs)))

    def contains(self, robot_id: str | int, seqs: ArrayLike) -> NDArray[np.bool_]:
        return np.asarray(self._seqs(robot_id, seqs)["contains"], dtype=bool)

    def stored_seqs(self, robot_id: str | int, *, retired: bool = False) -> NDArray[np.int64]:
        """The robot's stored seqs (``retired`` ones are never included here)."""
        if retired:
            raise ValueError("a sharded run's lookups leave retired seqs out")
        return np.asarray(self._seqs(robot_id)["stored"], dtype=np.int64)

    def retired_seqs(self, robot_id: str | int) -> NDArray[np.int64]:
        return np.asarray(self._seqs(robot_id)["retired"], dtype=np.int64)

    # ------------------------------------------------------------------ figures ------
    def refresh(self, filters: Sequence[RowFilter] = ()) -> list[dict[str, Any]]:
        """Every shard's figures (``BufferShard.counts``) for ``filters``; a shard that does not
        answer keeps its last ones. A shard process that changed (Ray restarted it) is
        reported to ``on_event`` as ``buffer.shard_restarted``; ``addresses`` follow the
        batch servers (a restarted one whose port was taken listens on another), and
        ``endpoints`` the shards' endpoint figures.

        Raises:
            BackpressureError: a shard has never answered yet.
        """
        refs = [a.counts.remote(list(filters)) for a in self.actors]
        figures: list[dict[str, Any]] = []
        for k, ref in enumerate(refs):
            try:
                got = self._get(k, ref, FIGURES_TIMEOUT_S)
            except BackpressureError:
                if k >= len(self._figures):
                    raise
                got = {**self._figures[k], "selected": [0] * len(filters)}
            figures.append(got)
        self.addresses = [str(f["address"]) for f in figures]
        self.endpoints = [f.get("endpoint") for f in figures]
        pids = [int(f["pid"]) for f in figures]
        for k, (was, pid) in enumerate(zip(self.pids, pids, strict=False)):
            if was != pid and self.on_event is not None:
                self.on_event("buffer.shard_restarted", {"shard": k, "pid": pid, "was": was})
        self.pids = pids
        self._figures = figures
        self._refreshed = time.monotonic()
        return figures

    def check(self, away_limit_s: float) -> None:
        """Raises ``ShardLost`` when a shard has not answered for ``away_limit_s``."""
        now = time.monotonic()
        for k, t in enumerate(self._answered):
            if now - t > away_limit_s:
                raise ShardLost(f"buffer shard {k} has not answered for {now - t:.0f}s")

    def count(self, rows: RowFilter | None = None) -> int:
        """Eligible rows ``rows`` keeps over every shard (``len(ReplayBuffer.select(rows))``)."""
        return sum(int(f["selected"][0]) for f in self.refresh([rows or RowFilter()]))

    def _recent(self) -> list[dict[str, Any]]:
        """The shards' figures, refreshed when older than ``FIGURES_MAX_AGE_S`` (one record
        of the run's figures reads them several times)."""
        if time.monotonic() - self._refreshed > FIGURES_MAX_AGE_S:
            self.refresh()
        return self._figures

    def __len__(self) -> int:
        """Transitions in the shards' windows (at most ``FIGURES_MAX_AGE_S`` old)."""
        return sum(int(f["size"]) for f in self._recent())

    def stats(self) -> dict[str, float | int]:
        """``ReplayBuffer.stats`` over the shards (``ShardedBuffer.stats``; at most
        ``FIGURES_MAX_AGE_S`` old)."""
        each = [dict(f["stats"]) for f in self._recent()]
        hits = [int(e.pop("hits")) for e in each]
        misses = [int(e.pop("misses")) for e in each]
        return merge_stats(each, hits, misses)

    @property
    def requests(self) -> int:
        """Requests the shards' batch servers answered (as last refreshed)."""
        return sum(int(f["requests"]) for f in self._figures)

    @property
    def learner_stats(self) -> dict[str, float]:
        """The learner's latest statistics (it sends them to every shard: shard 0's)."""
        return dict(self._figures[0]["learner_stats"]) if self._figures else {}

    @property
    def mix_shares(self) -> dict[str, float]:
        """Shard 0's adaptive per-task online shares (each shard keeps its own)."""
        return dict(self._figures[0]["mix_shares"]) if self._figures else {}

    def close(self) -> None:
        """Close every shard (its batch server, WAL and directory lock), then end its actor."""
        import ray

        try:
            ray.get([a.close.remote() for a in self.actors], timeout=self.timeout_s)
        except Exception:  # a shard that is away has nothing open to close
            log.exception("closing the buffer shards")
        for a in self.actors:
            ray.kill(a, no_restart=True)


def _ipc(part: pa.RecordBatch | pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, part.schema) as w:
        w.write(part)
    return bytes(sink.getvalue().to_pybytes())
