"""One buffer shard in its own process: what a Ray actor on any node runs (``buffer.service.shards``).

A :class:`BufferShard` opens its shard directory (on its node's disk), serves batches with its
own :class:`buffer.service.batches.BatchServer` (listening on ``host``, where the learner reaches it)
and takes appends as Arrow IPC stream bytes, so nothing but bytes and plain values crosses
process or node boundaries. ``start_shards`` places one actor per shard with Ray; the cloud
routes each robot's uploads to ``shards[shard_of(robot_id, n)]`` and the learner samples with
``buffer.service.sharded_batches.ShardedRemoteBuffer(addresses)`` (a run's shards:
``buffer.service.shard_client.ShardActors``).

Everything a shard needs is in its constructor's arguments (its offline mounts, its sampler's
factory, its batch server's token: ``buffer.service.batch_token``), so Ray can restart a shard process that died by running the constructor again: the
shard recovers from its WAL and its batch server binds the port it had (kept in the shard
directory, ``batch_port``), where the learner's sockets reconnect by themselves.

Acknowledgement is unchanged: ``append_ipc`` returns the shard's ``acked`` only after its
fdatasync, and the front acknowledges the robot with it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import zmq

from buffer.config import BufferSettings
from buffer.errors import BackpressureError, BufferClosedError, DiskFullError, StepValidationError
from buffer.sampling.samplers import Sampler
from buffer.service.batches import BatchServer, MixConfig
from buffer.service.shards import shard_count, shard_dir, shard_settings
from buffer.table.replay_buffer import ReplayBuffer
from buffer.table.schema import StepSchema
from foundation.durable import atomic_write_text
from foundation.rows import RowFilter

PORT_FILE = "batch_port"


class ShardEndpoint(Protocol):
    """A service a shard runs in its own process beside its batch server (its ingest
    endpoint, ``comms.cloud.shard_ingest``)."""

    def figures(self) -> dict[str, Any]:
        """Plain values about it (``address`` at least), reported with the shard's counts."""
        ...

    def stop(self) -> None: ...


# (the shard's open buffer, its index, its directory) -> a started endpoint. Picklable: Ray
# runs it again in a restarted shard process.
EndpointFactory = Callable[[ReplayBuffer, int, Path], ShardEndpoint]
SamplerFactory = Callable[[bool, dict[str, float]], Sampler | None]
# (directory, rows kept, name, task every row counts as): one offline mount of every shard.
Mount = tuple[str, RowFilter, str, str | None]


NODE_HOST = "node"


def batch_host(host: str) -> str:
    """``host``, or for :data:`NODE_HOST` the IP of the node this process runs on (Ray's)."""
    if host != NODE_HOST:
        return host
    import ray

    return str(ray.util.get_node_ip_address())


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
        host: where the batch server listens (``127.0.0.1`` on one machine; ``node``: this
            node's IP as Ray knows it, :func:`batch_host`).
        sampler: the batch server's sampler (the run's algorithm's; None: uniform).
        mounts: offline data every shard mounts (``Mount``), before its batch server starts.
        sampler_factory: builds the sampler instead of ``sampler``, called with (offline data
            mounted, the batch server's adaptive per-task shares).
        mix: the batch server's online share when offline data is mounted.
        endpoint: starts a service on the open buffer after the batch server (the run's
            ingest endpoint); its ``figures()`` are the counts' ``endpoint``.
        token: the batch server's token (the shards' ``ShardActors.token``; a restarted
            shard gets the same one with its other arguments).

    Raises:
        ValueError: ``shards`` differs from the recorded count; ``token`` is empty.
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
        mounts: Sequence[Mount] = (),
        sampler_factory: SamplerFactory | None = None,
        mix: MixConfig | None = None,
        endpoint: EndpointFactory | None = None,
        *,
        token: str,
    ) -> None:
        shard_count(root, shards)
        self.token = token
        self.k = k
        self.directory = shard_dir(root, k)
        self.buffer = ReplayBuffer.open(
            self.directory, StepSchema.from_json(schema_json), BufferSettings(**settings)
        )
        try:
            for directory, rows, name, task in mounts:
                self.buffer.mount(directory, rows, name=name, as_task=task)
            shares: dict[str, float] = {}
            if sampler_factory is not None:
                sampler = sampler_factory(bool(self.buffer.offline), shares)
            self.server = self._serve(tasks, sampler, demonstration_robots, host, mix, shares)
        except BaseException:
            self.buffer.close()
            raise
        try:
            self.endpoint = None if endpoint is None else endpoint(self.buffer, k, self.directory)
        except BaseException:
            self.server.close()
            self.buffer.close()
            raise

    def _serve(
        self,
        tasks: Sequence[str],
        sampler: Sampler | None,
        demonstration_robots: Iterable[str],
        host: str,
        mix: MixConfig | None,
        shares: dict[str, float],
    ) -> BatchServer:
        """The batch server, on the port this shard had when it has one (taken: another)."""
        path = self.directory / PORT_FILE
        port = int(path.read_text()) if path.exists() else 0

        def start(p: int) -> BatchServer:
            return BatchServer(
                self.buffer,
                tasks,
                sampler,
                demonstration_robots=demonstration_robots,
                mix=mix,
                host=host,
                mix_shares=shares,
                port=p,
                token=self.token,
            )

        host = batch_host(host)
        try:
            server = start(port)
        except zmq.ZMQError:
            server = start(0)
        if server.port != port:
            atomic_write_text(path, str(server.port))
        return server

    def address(self) -> str:
        """The batch server's ``tcp://`` address."""
        return self.server.address

    def pid(self) -> int:
        return os.getpid()

    def append_ipc(self, data: bytes) -> dict[str, int]:
        """Append the step batch in ``data`` (Arrow IPC stream bytes of robots of this
        shard); returns ``acked`` (robot -> highest durable seq) after the fdatasync.

        Raises:
            as ``ReplayBuffer.append``.
        """
        table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
        return self.buffer.append(table).acked

    def append_ipc_result(self, data: bytes, timeout: float | None = None) -> dict[str, Any]:
        """:meth:`append_ipc` with its outcome as a value: ``acked``, ``stored``,
        ``duplicates``; or ``error`` (``backpressure``, ``disk_full``, ``invalid``,
        ``closed``), ``message`` and ``retry`` (s), which :func:`raise_append_error` raises
        again as the buffer's own error."""
        table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
        try:
            r = self.buffer.append(table, timeout=timeout)
        except BackpressureError as exc:
            return {"error": "backpressure", "message": str(exc), "retry": exc.retry_after_s}
        except DiskFullError as exc:
            return {"error": "disk_full", "message": str(exc)}
        except StepValidationError as exc:
            return {"error": "invalid", "message": str(exc)}
        except BufferClosedError as exc:
            return {"error": "closed", "message": str(exc)}
        return {"acked": r.acked, "stored": r.stored, "duplicates": r.duplicates}

    def durable_seq(self, robot_id: str) -> int | None:
        return self.buffer.durable_seq(robot_id)

    def mark_episode(
        self, robot_id: str, run_id: str, episode_index: int, kind: str, reason: str
    ) -> int:
        return self.buffer.mark_episode(robot_id, run_id, episode_index, kind, reason)

    def seqs(self, robot_id: str, asked: np.ndarray) -> dict[str, np.ndarray]:
        """The robot's lookups for accounting: ``contains`` (bool per ``asked`` seq),
        ``stored`` (its seqs still stored, retired ones left out), ``retired`` (int64)."""
        return {
            "contains": self.buffer.contains(robot_id, asked),
            "stored": self.buffer.stored_seqs(robot_id, retired=False),
            "retired": self.buffer.retired_seqs(robot_id),
        }

    def counts(self, filters: Sequence[RowFilter]) -> dict[str, Any]:
        """``size`` (transitions in the window), ``selected`` (eligible rows each filter
        keeps), ``offline`` (rows of each mounted view), ``stats`` (``ReplayBuffer.stats``
        plus the cache's ``hits`` and ``misses``) and the batch server's ``requests``,
        ``learner_stats``, ``mix_shares`` and ``address``, the process ``pid`` and the
        ``endpoint``'s figures (None without one)."""
        storage = self.buffer.storage
        return {
            "size": len(self.buffer),
            "selected": [len(self.buffer.select(f)) for f in filters],
            "offline": [len(v) for v in self.buffer.offline],
            "offline_tasks": [v.task_names for v in self.buffer.offline],
            "stats": {**self.buffer.stats(), "hits": storage.hits, "misses": storage.misses},
            "requests": self.server.requests,
            "learner_stats": dict(self.server.learner_stats),
            "mix_shares": dict(self.server.mix_shares),
            "pid": os.getpid(),
            "address": self.server.address,
            "endpoint": None if self.endpoint is None else self.endpoint.figures(),
        }

    def size(self) -> int:
        """Transitions in the shard's window."""
        return len(self.buffer)

    def close(self) -> None:
        if self.endpoint is not None:
            self.endpoint.stop()
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
    mounts: Sequence[Mount] = (),
    sampler_factory: SamplerFactory | None = None,
    mix: MixConfig | None = None,
    endpoint: EndpointFactory | None = None,
    token: str,
) -> list[Any]:
    """One Ray actor per shard (``ray.init`` done by the caller); returns their handles,
    shard ``k`` at ``k``. ``actor_options`` go to ``.options()``: e.g. a node's custom
    resource (``{"resources": {"buffer-node-1": 1}}``), a scheduling strategy to place each
    shard where its directory is, ``max_restarts``. Each shard gets an equal part of the
    memory budget and limits (:func:`shard_settings`) and its own copy of ``sampler`` (the
    run's algorithm's; None: uniform) or one built by ``sampler_factory``; ``mounts``,
    ``mix``, ``endpoint`` and ``token`` (every shard's batch token): :class:`BufferShard`.

    Raises:
        ValueError: ``shards`` differs from the count recorded under ``root``.
    """
    import ray

    fields = shard_settings(settings, shards).model_dump()
    # Appends of many robots wait on one group commit together: a threaded actor.
    options = {"num_cpus": 0, "max_concurrency": 32, **(actor_options or {})}
    remote = ray.remote(BufferShard).options(**options)
    demos = list(demonstration_robots)
    return [
        remote.remote(
            str(root),
            k,
            shards,
            schema.to_json(),
            fields,
            list(tasks),
            demos,
            host,
            sampler,
            list(mounts),
            sampler_factory,
            mix,
            endpoint,
            token=token,
        )
        for k in range(shards)
    ]


def raise_append_error(reply: Mapping[str, Any], directory: str) -> None:
    """Raise the buffer's error an ``append_ipc_result`` reply reports (nothing when it
    reports none)."""
    kind = reply.get("error")
    if kind is None:
        return
    message = str(reply.get("message", ""))
    if kind == "backpressure":
        raise BackpressureError(message, float(reply.get("retry", 0.5)))
    if kind == "disk_full":
        import errno

        raise DiskFullError(directory, OSError(errno.ENOSPC, message))
    if kind == "invalid":
        raise StepValidationError(message)
    if kind == "closed":
        raise BufferClosedError(message)
    raise RuntimeError(f"shard append failed: {kind}: {message}")
