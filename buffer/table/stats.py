"""The metrics of one open buffer (``ReplayBuffer.stats``)."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np

from buffer.table.index import RowIndex
from buffer.table.retention import Retention
from buffer.table.state import TableState
from buffer.table.storage import TieredStorage
from buffer.table.writer import Writer


class StatsSource(Protocol):
    """The parts of one open buffer its metrics read (``buffer.ReplayBuffer`` is one)."""

    @property
    def directory(self) -> Path: ...

    @property
    def state(self) -> TableState: ...

    @property
    def storage(self) -> TieredStorage: ...

    @property
    def index(self) -> RowIndex: ...

    @property
    def writer(self) -> Writer: ...

    @property
    def retention(self) -> Retention: ...

    @property
    def recovery_seconds(self) -> float:
        """Seconds the last opening spent recovering."""
        ...

    @property
    def num_steps(self) -> int:
        """Steps stored and visible."""
        ...

    def __len__(self) -> int:
        """Transitions in the online window."""
        ...


def buffer_stats(buf: StatsSource) -> dict[str, float | int]:
    """Metrics: ``size_transitions``, ``steps``, ``bytes_on_disk``, ``bytes_in_cache``
    (hot tier), ``cold_resident_bytes`` (estimate), ``cache_hit_rate`` (share of sampled
    rows served from RAM, 0..1), ``prefetch_lag_s`` (age of the oldest pending prefetch
    request), ``segments``, ``hot_segments``, ``wal_fsyncs``, ``appends`` (calls with
    records), ``merged_appends`` (of them, stored as part of a merged one: small appends
    waiting together are validated, logged and synced as one, ``buffer.table.writer``),
    ``ack_latency_p50_s``,
    ``ack_latency_p99_s``, ``ack_staging_ms`` / ``ack_writing_ms`` / ``ack_durable_ms`` /
    ``ack_visible_ms`` (mean milliseconds per append that stored records, by phase since
    opening: ``buffer.table.ack_phases``), ``recovery_seconds``, ``discarded_episodes`` (marked, of either
    kind), ``rerecorded_episodes`` (those marked ``rerecord``), ``discarded_steps`` (their
    stored rows), ``interrupted_episodes`` (closed as truncated, ``buffer.table.index``) and
    ``successful_episodes`` (marked ``success``)."""
    s = buf.storage
    with buf.state.lock:
        disk = 0
        for p in buf.directory.glob("*"):
            if p.is_file():
                disk += p.stat().st_size
        served = s.hits + s.misses
        lat = np.asarray(buf.writer.ack_latencies[-10_000:], dtype=np.float64)
        wal = buf.writer.wal
        kinds = list(buf.index.discards.values())
        return {
            "size_transitions": len(buf),
            "steps": buf.num_steps,
            "bytes_on_disk": disk,
            "bytes_in_cache": s.hot_bytes(),
            "cold_resident_bytes": max(s.cold_touched, 0),
            "cache_hit_rate": (s.hits / served) if served else 1.0,
            "prefetch_lag_s": s.current_prefetch_lag() or s.prefetch_lag_s,
            "segments": len(buf.retention.segments),
            "hot_segments": sum(1 for c in s.chunks if c.hot and c.sealed),
            "wal_fsyncs": wal.fsync_count if wal else 0,
            "appends": buf.writer.admission.appends,
            "merged_appends": buf.writer.admission.merged_appends,
            "ack_latency_p50_s": float(np.percentile(lat, 50)) if lat.size else 0.0,
            "ack_latency_p99_s": float(np.percentile(lat, 99)) if lat.size else 0.0,
            **{f"ack_{k}_ms": v for k, v in buf.writer.ack_phases.mean_ms().items()},
            "recovery_seconds": buf.recovery_seconds,
            "discarded_episodes": len(kinds),
            "rerecorded_episodes": kinds.count("rerecord"),
            "discarded_steps": buf.index.discarded_steps,
            "interrupted_episodes": buf.index.interrupted_episodes,
            "successful_episodes": buf.index.successful_episodes(),
        }
