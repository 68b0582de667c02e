"""A run's buffer in ``buffer.shards`` shards (above 1): Ray actors, each shard its own WAL,
segments and batch server (``buffer.service.shard_client.ShardActors``).

Opening one: the offline data is found, imported and checked against the run's schema once,
in this process, on a scratch buffer (``runs.offline.mount_sources``: the provenance and
refusals of a single buffer), then every shard mounts the same directories with the same
filters; each shard builds its batch server's sampler with the run's algorithm
(:class:`RunSampler`) and mix. Robots land in shards by ``buffer.service.shards.shard_of``
of their id, recorded with the count under ``<run_dir>/buffer`` so a resumed run keeps them
where they were (another count is refused).

:class:`ShardedBatches` is the run's batch service over the shards: the learner gets every
shard's address (``--batches`` with commas) and samples them with
``buffer.service.sharded_batches.ShardedRemoteBuffer`` (prefetching), in proportion to their sizes.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from buffer.sampling.samplers import Sampler
from buffer.service.batches import MixConfig
from buffer.service.shard_actor import EndpointFactory, Mount
from buffer.service.shard_client import ShardActors
from foundation.runspec import RunSpec
from runs.offline import mount_sources

SCRATCH = ".offline-check-"


class RunSampler:
    """The run's batch sampler, built where a shard runs (picklable: the spec travels as
    JSON); ``RunSampler(spec)(offline, shares)`` is ``RunPlan.sampler(offline, shares)``."""

    def __init__(self, spec: RunSpec) -> None:
        self.spec_json = spec.model_dump(mode="json")

    def __call__(self, offline: bool, shares: dict[str, float]) -> Sampler | None:
        from cloud_learner.run_plan import RunPlan
        from foundation.runspec import parse_run_spec

        return RunPlan.from_spec(parse_run_spec(self.spec_json)).sampler(offline, shares)


def mix_config(spec: RunSpec) -> MixConfig:
    """The batch service's online share of the run (``buffer.online_fraction``, ``mix``)."""
    b = spec.buffer
    return MixConfig(
        b.online_fraction, b.mix == "adaptive", b.adaptive.min_online, b.adaptive.max_online
    )


def checked_mounts(
    spec: RunSpec, schema: Any, config: Any, run_dir: Path, data_dir: Path
) -> tuple[list[dict[str, Any]], list[Mount]]:
    """(provenance, mounts) of the spec's offline data, checked against ``schema`` on a
    scratch buffer in ``run_dir`` (removed again).

    Raises:
        runs.offline.OfflineDataError: as ``mount_sources``.
    """
    from buffer import ReplayBuffer

    if not spec.buffer.offline_data:
        return [], []
    for stale in run_dir.glob(f"{SCRATCH}*"):  # left by a cloud that died checking
        shutil.rmtree(stale, ignore_errors=True)
    scratch_dir = Path(tempfile.mkdtemp(prefix=SCRATCH, dir=run_dir))
    scratch = ReplayBuffer.open(scratch_dir, schema, config.model_copy(update={"prefetch": False}))
    try:
        provenance = mount_sources(scratch, spec, run_dir, data_dir)
        for view in scratch.offline:
            if view.buffer is not scratch:
                view.buffer.close()
    finally:
        scratch.close()
        shutil.rmtree(scratch_dir, ignore_errors=True)
    mounts: list[Mount] = []
    for entry in provenance:
        source = spec.buffer.offline_data[int(entry["index"])]
        mounts.append((str(entry["mounted"]), source.rows(), source.source, source.task))
    return provenance, mounts


def open_shards(
    spec: RunSpec,
    schema: Any,
    config: Any,
    run_dir: Path,
    mounts: list[Mount],
    demonstration_robots: list[str],
    on_event: Callable[..., None],
    endpoint: EndpointFactory | None = None,
) -> ShardActors:
    """The run's ``spec.buffer.shards`` shard actors under ``run_dir/buffer``, opened;
    ``endpoint``: the service each shard starts beside its batch server (the run's ingest
    endpoint, ``comms.cloud.shard_ingest.ShardIngest``).

    Raises:
        ValueError: the run's buffer holds another shard count.
    """
    shards = ShardActors.start(
        run_dir / "buffer",
        spec.buffer.shards,
        schema,
        config,
        spec.tasks,
        mounts=mounts,
        sampler_factory=RunSampler(spec),
        mix=mix_config(spec),
        demonstration_robots=demonstration_robots,
        on_event=lambda kind, data: on_event(kind, **data),
        endpoint=endpoint,
    )
    on_event(
        "buffer.shards_started",
        shards=len(shards.actors),
        pids=shards.pids,
        addresses=shards.addresses,
        ingest=[e["address"] if e else "" for e in shards.endpoints],
    )
    return shards


def new_endpoint_events(
    endpoints: Sequence[Mapping[str, Any] | None],
    pids: Sequence[int],
    seen: dict[int, tuple[int, int]],
) -> list[tuple[str, dict[str, Any]]]:
    """The run events of the shards' ingest endpoints (``events`` in their figures,
    ``comms.cloud.shard_ingest.EndpointEvents``) not returned before, as ``(kind, data)``.

    ``seen`` (shard -> (its process id, the last event number returned)) is updated; a shard
    process that changed (Ray restarted it) numbers its events from 0 again.
    """
    out: list[tuple[str, dict[str, Any]]] = []
    for k, (figures, pid) in enumerate(zip(endpoints, pids, strict=False)):
        if not figures:
            continue
        was, last = seen.get(k, (pid, -1))
        if was != pid:
            last = -1
        for e in figures.get("events", ()):
            if int(e["n"]) > last:
                out.append((str(e["kind"]), dict(e["data"])))
                last = int(e["n"])
        seen[k] = (pid, last)
    return out


class ShardedBatches:
    """The run's batch service over its shards: what ``RunLearning`` reads of a
    ``BatchServer`` (``address``: every shard's, comma-separated; ``requests``; the
    learner's statistics and the adaptive shares as the shards last reported them)."""

    def __init__(self, shards: ShardActors, spec: RunSpec, away_limit_s: float = 300.0) -> None:
        self.shards = shards
        self.tasks = {t: i for i, t in enumerate(spec.tasks)}
        self.mix = mix_config(spec)
        self.away_limit_s = away_limit_s
        self._polled = float("-inf")

    def poll(self) -> None:
        """The shards' figures, at most once a second (a restarted shard is reported then).

        Raises:
            buffer.service.shard_client.ShardLost: a shard has not answered for
                ``away_limit_s`` (Ray gave up restarting it): the run ends as crashed.
        """
        now = time.monotonic()
        if now - self._polled >= 1.0:
            self._polled = now
            self.shards.refresh()
            self.shards.check(self.away_limit_s)

    @property
    def address(self) -> str:
        """Every shard's batch server address, comma-separated (as last refreshed)."""
        return ",".join(self.shards.addresses)

    @property
    def token(self) -> str:
        """The shards' batch token (the learner's requests carry it)."""
        return self.shards.token

    @property
    def requests(self) -> int:
        return self.shards.requests

    @property
    def learner_stats(self) -> dict[str, float]:
        return self.shards.learner_stats

    @property
    def mix_shares(self) -> Mapping[str, float]:
        return self.shards.mix_shares

    def close(self) -> None:
        """The shards' batch servers close with the shards."""
