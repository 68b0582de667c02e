"""The learning side of a run in the cloud process: the run's buffer (every acknowledged step,
the robots' demonstrations among them, and the offline data mounted into it), the buffer's
service to the learner, the supervised learner process (``python -m cloud_learner.process``)
the feed of its weight versions to comms' distributor, and the run's version rows in the
metadata store (:mod:`runs.versions`, their one writer).

The learner is supervised for crashes and hangs: alive, but no batch taken and no update for
``orchestration.learner_hang_s`` (``learner_warmup_hang_s`` until the run's first version, for
start-up and the BC warm start, and from each restart until the learner's first batch). Progress is the batch server's request count (a learner waiting for data at its
samples-per-insert rate still polls it) and the learner's reported step. A learner that refuses
the run (``cloud_learner.process.EXIT_REFUSED``: a checkpoint the spec no longer fits, a GPU
the node lacks) is not restarted: :meth:`RunLearning.poll` raises :class:`LearnerRefused`
with its refusal.

The learner gets the batch service's token (``buffer.service.batch_token``: one per run, or
per group of shards) in its environment, never on its command line.

A run with ``buffer.shards`` above 1 keeps its buffer in shard actors instead, each with its
own batch server and ingest endpoint (:mod:`runs.sharded`); the learner samples all of them,
and the run's robots upload to their shards' endpoints with the tickets the cloud gives them
(:meth:`RunLearning.ingest_route`).

Versions already in the run's ``weights/`` when the learner starts (the last attempt's) are not
handed to comms again: the first version handed on is one this learner published, after it
passed its start checks, so robots and the evaluator never run a policy of a refused start.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from buffer.service.batch_token import TOKEN_ENV, new_token
from buffer.service.shard_client import most_shards_on_a_node
from cloud_learner.process import EXIT_REFUSED, read_refusal
from cloud_learner.run_plan import RunPlan
from comms.cloud.shard_ingest import ShardIngest
from comms.cloud.shard_ports import check_range
from comms.cloud.shard_routes import ShardRoutes
from comms.cloud.weight_file import WeightFileFeed, latest_version
from comms.wire import tickets
from foundation.rows import RowFilter
from foundation.runspec import RunSpec
from hal.compat import RunFeatures
from runs.offline import mount_sources
from runs.sharded import (
    ShardedBatches,
    checked_mounts,
    mix_config,
    new_endpoint_events,
    open_shards,
)
from runs.starting import initial_weights_path
from runs.supervisor import ChildRefused, ProcessSupervisor
from runs.versions import VersionRecorder

log = logging.getLogger(__name__)
DEMO_ROBOT = "demo"  # robot_id of the cloud-side scripted demonstrations of older runs


class LearnerRefused(RuntimeError):
    """The run's learner refused to start it; ``str``: its refusal (the run ends with it)."""


class RunLearning:
    """Buffer, batch server, learner process and weight feed of one run.

    The batch server draws with the sampler the run's algorithm builder gives it (asked once
    here, when the buffer and its offline data are known); the builder's rate limiter paces
    the learner (``cloud_learner.process``).

    Args:
        ctx: the cloud's shared services (``runs.cloud_context.CloudContext``).
        run_id / run_dir: the run.
        plan: its spec resolved (``cloud_learner.run_plan.RunPlan``: the algorithm's builder).
        features: the features its robots share (the buffer's schema).
        on_event: records an event of the run (``kind, **data``).
    """

    def __init__(
        self,
        ctx: Any,
        run_id: str,
        run_dir: Path,
        plan: RunPlan,
        features: RunFeatures,
        on_event: Callable[..., None],
    ) -> None:
        from comms.cloud.replay_buffer_sink import ReplayBufferSink

        self.ctx, self.run_id, self.run_dir = ctx, run_id, run_dir
        self.on_event = on_event
        spec = plan.spec
        self.buffer: Any  # a ReplayBuffer, or the shards' ShardActors
        self.batch_server: Any  # a BatchServer, or ShardedBatches
        self.routes: Any = None  # a sharded run's ShardRoutes
        self._endpoint_events: dict[int, tuple[int, int]] = {}  # runs.sharded.new_endpoint_events
        if spec.buffer.shards > 1:
            self._open_shards(spec, features)
        else:
            self._open_one(plan, features)
        ctx.sinks[run_id] = ReplayBufferSink(self.buffer)
        init = initial_weights_path(spec, Path(ctx.settings.data_dir), ctx.store)
        self.learner = ProcessSupervisor(
            "learner",
            [
                *(ctx.python, "-m", "cloud_learner.process"),
                *("--run-dir", str(run_dir)),
                *("--batches", self.batch_server.address),
                *(("--init-weights", str(init)) if init is not None else ()),
            ],
            run_dir / "learner.log",
            ctx.learner_restarts,
            on_event=lambda kind, data: on_event(kind, **data),
            # The batch token goes in the environment: a command line is world-readable.
            env={**os.environ, TOKEN_ENV: self.batch_server.token},
            final_exit_codes=[EXIT_REFUSED],
        )
        weights = run_dir / "weights"
        self._weights = WeightFileFeed(
            ctx.server.distributor(run_id), weights, after_version=latest_version(weights)
        )
        self.versions = VersionRecorder(ctx.store, run_id, run_dir)
        self.version = 0  # the newest version handed to comms
        self.latest_bytes = b""  # its safetensors file
        try:
            self.learner.start()
        except BaseException:
            self.close()
            raise

    def _open_one(self, plan: RunPlan, features: RunFeatures) -> None:
        """One buffer in this process, its offline data and its batch server."""
        from buffer import ReplayBuffer, StepSchema
        from buffer.service.batches import BatchServer

        spec = plan.spec
        schema = StepSchema.from_features(features.observation_features, features.action_features)
        self.buffer = ReplayBuffer.open(self.run_dir / "buffer", schema, self._buffer_config(spec))
        try:
            # Offline data first: a source that is gone or does not fit ends the start here.
            self.offline_sources = mount_sources(
                self.buffer, spec, self.run_dir, Path(self.ctx.settings.data_dir)
            )
            for entry in self.offline_sources:
                self.on_event("run.offline_mounted", **entry)
            # Demonstrations come from the robots' operators (edge_agent); rows of a run's
            # cloud-side scripted demonstrations (robot "demo", runs before that) still count.
            self.demo_rows = len(self.buffer.select(RowFilter(robot_ids=(DEMO_ROBOT,))))
            shares: dict[str, float] = {}  # SOP's adaptive per-task shares, the server's
            self.batch_server = BatchServer(
                self.buffer,
                spec.tasks,
                plan.sampler(offline=bool(self.buffer.offline), shares=shares),
                offline_rows=self.demo_rows,
                demonstration_robots=[DEMO_ROBOT],
                mix=mix_config(spec),
                mix_shares=shares,
                token=new_token(),
            )
        except BaseException:
            self.buffer.close()  # its directory lock must not outlive a failed start
            raise

    def _open_shards(self, spec: RunSpec, features: RunFeatures) -> None:
        """``buffer.shards`` shard actors (``runs.sharded``), the offline data mounted in
        each, and the batch service over their servers.

        Raises:
            comms.cloud.shard_ports.PortRangeTooSmall: ``comms.shard_ingest_ports`` is too
                few for the shards a buffer node may host (two ports each with the data plane).
        """
        from buffer import StepSchema

        schema = StepSchema.from_features(features.observation_features, features.action_features)
        config = self._buffer_config(spec)
        data_dir = Path(self.ctx.settings.data_dir)
        self.offline_sources, mounts = checked_mounts(spec, schema, config, self.run_dir, data_dir)
        for entry in self.offline_sources:
            self.on_event("run.offline_mounted", **entry)
        self.demo_rows = 0  # the cloud-side demonstrations of older runs were never sharded
        comms = self.ctx.settings.comms
        # A node that may host more shards than its range has ports for refuses them one
        # at a time (a restart landing there too): refuse the run at its start instead.
        check_range(comms, most_shards_on_a_node(config, spec.buffer.shards))
        key = tickets.new_key()
        self.buffer = open_shards(
            spec,
            schema,
            config,
            self.run_dir,
            mounts,
            [DEMO_ROBOT],
            self.on_event,
            endpoint=ShardIngest(
                comms, self.run_id, key, insecure_network=self.ctx.settings.insecure_network
            ),
        )
        self.batch_server = ShardedBatches(self.buffer, spec)
        shards = self.buffer
        self.routes = ShardRoutes(
            self.run_id,
            key,
            spec.buffer.shards,
            lambda: [str(e["address"]) if e else "" for e in shards.endpoints],
            tls=comms.tls_cert_file is not None,
            ttl_s=comms.shard_ticket_ttl_s,
        )
        self.ctx.routes[self.run_id] = self.routes

    def ingest_route(self, robot_id: int, name: str) -> dict[str, Any] | None:
        """Robot ``robot_id``'s (named ``name``) ingest route for its assignment: its
        shard's endpoint and a fresh shard ticket; None for an unsharded run (the robot
        uploads to the cloud)."""
        return None if self.routes is None else self.routes.route_dict(robot_id, name)

    def ingest_figures(self) -> dict[str, Any]:
        """Rows stored by the cloud's own upload streams into this run (``cloud_rows``) and,
        for a sharded run, by each shard's ingest endpoint as last reported
        (``shard_rows``, shard ``k`` at ``k``, with ``shard_addresses`` and
        ``shard_data_plane_batches``: batches that came on the endpoints' data planes)."""
        out: dict[str, Any] = {"cloud_rows": int(self.ctx.server.uploaded_rows(self.run_id))}
        if self.routes is not None:
            ends = self.buffer.endpoints
            out["shard_rows"] = [int(e["rows"]) if e else 0 for e in ends]
            out["shard_addresses"] = [str(e["address"]) if e else "" for e in ends]
            out["shard_data_plane_batches"] = [
                int(e["data_plane_batches"]) if e else 0 for e in ends
            ]
        return out

    def _buffer_config(self, spec: RunSpec) -> Any:
        """The cloud's buffer settings with the run's own hot-tier budget, when it has one."""
        config = self.ctx.settings.buffer
        if spec.buffer.memory_budget_bytes is not None:
            config = config.model_copy(
                update={"memory_budget_bytes": spec.buffer.memory_budget_bytes}
            )
        return config

    @property
    def stats(self) -> dict[str, float]:
        """The learner's latest statistics, as the batch server last heard them."""
        return self.batch_server.learner_stats

    @property
    def online_shares(self) -> dict[str, float]:
        """Each task's online share of the batches (offline data mounted; adaptive: SOP's
        per-task share, fixed: ``buffer.online_fraction``); empty without offline data."""
        if not self.buffer.offline:
            return {}
        server = self.batch_server
        fixed = server.mix.online_fraction
        return {t: float(server.mix_shares.get(t, fixed)) for t in server.tasks}

    def poll(self, hang_s: float, warmup_hang_s: float) -> None:
        """Supervise the learner (restart a crashed or hung one).

        Raises:
            CrashLoop: it crashed too often; the run ends as crashed.
            LearnerRefused: it refused the run; the run ends as crashed, with the refusal.
            buffer.service.shard_client.ShardLost: a buffer shard is gone for good.
        """
        if isinstance(self.batch_server, ShardedBatches):
            self.batch_server.poll()
            self._follow_batch_addresses()
            shards = self.buffer
            seen = self._endpoint_events
            for kind, data in new_endpoint_events(shards.endpoints, shards.pids, seen):
                self.on_event(kind, **data)  # a shard's disk full / recovered
        self.learner.note_progress((self.batch_server.requests, self.stats.get("learner_step")))
        self.learner.hang_after_s = hang_s if self.version else warmup_hang_s
        self.learner.start_hang_s = warmup_hang_s  # a restart imports and loads before its batch
        try:
            self.learner.poll()
        except ChildRefused as exc:
            reason = read_refusal(self.run_dir) or str(exc)
            self.on_event("learner.refused", reason=reason)
            raise LearnerRefused(f"learner refused: {reason}") from None

    def _follow_batch_addresses(self) -> None:
        """A restarted shard whose batch port was taken listens on another: the learner is
        stopped (its final checkpoint) and started again with the shards' addresses."""
        argv = self.learner.argv
        at = argv.index("--batches") + 1
        address = self.batch_server.address
        if argv[at] == address:
            return
        self.on_event("learner.batches_moved", batches=address, was=argv[at])
        argv[at] = address
        self.learner.stop()
        self.learner.start()

    @property
    def serves_an_earlier_version(self) -> bool:
        """comms serves robots a version of an earlier attempt of the run (this cloud's
        distributor kept it) and none of this learner's is out yet."""
        return self.version == 0 and self._weights.distributor.last_version > 0

    def checkpoint(self) -> None:
        """Ask the learner for a checkpoint at its next update boundary."""
        self.learner.signal(signal.SIGUSR1)

    def publish_new_weights(self) -> bool:
        """Hand a newer version of the learner's weight directory to comms' distributor as it
        is (no decode and re-snapshot; a distributor kept across restarts that is ahead
        already is left as it is); True when there was one. The learner's versions and
        checkpoints are recorded in the metadata store first."""
        self.versions.poll()
        got = self._weights.poll()
        if got is None:
            return False
        self.version, blob = got
        self.latest_bytes = bytes(blob)  # the distributor owns ``blob``
        return True

    def close(self) -> None:
        """The learner has stopped: record its last versions and checkpoints, let go of the
        batch server, the upload sink, the buffer."""
        try:
            self.versions.poll()
        except Exception:  # the rows are recorded again by the next start of the run
            log.exception("recording the learner's last versions")
        self.batch_server.close()
        self.ctx.sinks.pop(self.run_id, None)
        if self.routes is not None:
            self.ctx.routes.pop(self.run_id, None)
            try:
                self.buffer.refresh()
                self.on_event("buffer.ingest", **self.ingest_figures())
            except Exception:  # a shard that is away: its figures are not final anyway
                log.exception("reading the shards' ingest figures")
        self.buffer.close()
