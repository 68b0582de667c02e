"""One buffer shard in its own process: what a Ray actor on any node runs (``buffer.service.shards``).

A :class:`BufferShard` opens its shard directory (on its node's disk), serves batches with its
own :class:`buffer.service.batches.BatchServer` (listening on ``host``, where the learner reaches it)
and takes appends as Arrow IPC stream bytes, so nothing but bytes and plain values crosses
process or node boundaries. ``start_shards`` places one actor per shard with Ray; the cloud
routes each robot's uploads to ``shards[shard_of(robot_id, n)]`` and the learner samples with
``buffer.service.batches.ShardedRemoteBuffer(addresses)``.

Acknowledgement is unchanged: ``append_ipc`` returns the shard's ``acked`` only after its
fdatasync, and the front acknowledges the robot with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from buffer.config import BufferSettings
from buffer.sampling.samplers import Sampler
from buffer.service.batches import BatchServer
from buffer.service.shards import shard_count, shard_dir
from buffer.table.replay_buffer import ReplayBuffer
from buffer.table.schema import StepSchema


class BufferShard:
    """Shard ``k`` of the buffer under ``root`` (see the module docstring).

    Args:
        root: the sharded buffer's directory (on this node); the shard opens
            ``root/shard-<k>``.
        k / shards: this shard and the count (checked against ``root/shards.json``).
        schema_json: ``StepSchema.to_json()`` of the run.
        settings: ``BufferSettings`` fields for this shard (its own memory budget).
        tasks: the run's tasks (the batch server's ``task_index``).
        demonstration_robots: robots whose steps are demonstrations.
        host: where the batch server listens (``127.0.0.1`` on one machine).
        sampler: the batch server's sampler (the run's algorithm's; None: uniform).
    """

    def __init__(
        self,
        root: str,
        k: int,
        shards: int,
        schema_json: str,
        settings: dict[str, Any],
        tasks: Sequence[str],
        demonstration_robots: Iterable[str] = (),
        host: str = "127.0.0.1",
        sampler: Sampler | None = None,
    ) -> None:
        shard_count(root, shards)
        self.buffer = ReplayBuffer.open(
            shard_dir(root, k), StepSchema.from_json(schema_json), BufferSettings(**settings)
        )
        self.server = BatchServer(
            self.buffer,
            tasks,
            sampler,
            demonstration_robots=demonstration_robots,
            host=host,
        )

    def address(self) -> str:
        """The batch server's ``tcp://`` address."""
        return self.server.address

    def append_ipc(self, data: bytes) -> dict[str, int]:
        """Append the step batch in ``data`` (Arrow IPC stream bytes of robots of this
        shard); returns ``acked`` (robot -> highest durable seq) after the fdatasync.

        Raises:
            as ``ReplayBuffer.append``.
        """
        table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
        return self.buffer.append(table).acked

    def durable_seq(self, robot_id: str) -> int | None:
        return self.buffer.durable_seq(robot_id)

    def size(self) -> int:
        """Transitions in the shard's window."""
        return len(self.buffer)

    def close(self) -> None:
        self.server.close()
        self.buffer.close()


def start_shards(
    root: str | Path,
    shards: int,
    schema: StepSchema,
    settings: BufferSettings,
    tasks: Sequence[str],
    *,
    demonstration_robots: Iterable[str] = (),
    host: str = "127.0.0.1",
    actor_options: dict[str, Any] | None = None,
    sampler: Sampler | None = None,
) -> list[Any]:
    """One Ray actor per shard (``ray.init`` done by the caller); returns their handles,
    shard ``k`` at ``k``. ``actor_options`` go to ``.options()``: e.g. a node's custom
    resource (``{"resources": {"buffer-node-1": 1}}``) or a scheduling strategy to place each
    shard where its directory is. Each shard gets an equal part of the memory budget and its
    own copy of ``sampler`` (the run's algorithm's; None: uniform).

    Raises:
        ValueError: ``shards`` differs from the count recorded under ``root``.
    """
    import ray

    fields = settings.model_copy(
        update={"memory_budget_bytes": max(settings.memory_budget_bytes // shards, 1)}
    ).model_dump()
    remote = ray.remote(BufferShard).options(**{"num_cpus": 0, **(actor_options or {})})
    demos = list(demonstration_robots)
    return [
        remote.remote(
            str(root), k, shards, schema.to_json(), fields, list(tasks), demos, host, sampler
        )
        for k in range(shards)
    ]
