"""Retention of the append-only metadata tables: metrics, events, leases, checkpoints, versions.

A long run adds rows to these tables without end (thousands of metric points and version rows
an hour). :func:`prune` keeps each one bounded by :class:`MetadataRetentionSettings`:

* ``metrics`` and ``policy_versions`` are *thinned*: once a series holds more than its cap,
  every other row of its older half is deleted. The newest half keeps full resolution and the
  curve keeps its first point, so a chart still spans the whole run; the count stays between
  3/4 of the cap and the cap.
* ``events`` keep the newest ``events_per_kind`` machine events (the cloud, its run manager,
  robots, benches) per (run, robot, kind), so a rare kind (``run.resuming``) is never pushed
  out by a frequent one (``learner.published``); events a person caused (``PERSON_ACTORS``,
  ``user:*``) are the audit log and are kept.
* released ``leases`` and ``checkpoints`` keep their newest rows.

Each pass deletes in bounded batches (``IN`` lists of at most :data:`BATCH`), one transaction
per group, so it never holds the database long; what it deletes is counted and returned.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, delete, func, select

from foundation.store.config import MetadataRetentionSettings
from foundation.store.metrics import Metric
from foundation.store.models import Checkpoint, Event, Lease, PolicyVersion

if TYPE_CHECKING:
    from sqlalchemy.orm import InstrumentedAttribute, Session

    from foundation.store.metadata_store import MetadataStore

log = logging.getLogger(__name__)

BATCH = 500  # ids per DELETE ... WHERE id IN (...): within every backend's parameter limit


@dataclass
class Pruned:
    """Rows one :func:`prune` pass deleted, per table."""

    metrics: int = 0
    events: int = 0
    leases: int = 0
    checkpoints: int = 0
    policy_versions: int = 0

    def total(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))


def thinned(ids: Sequence[int], cap: int) -> list[int]:
    """The ids to delete so that a series of ``ids`` (oldest first) fits ``cap``.

    Nothing when ``len(ids) <= cap``; else every other id of all but the newest ``cap // 2``,
    starting at the second (the first, the series' start, is kept), again until it fits.
    """
    kept, doomed = list(ids), []
    while len(kept) > cap:
        old, new = kept[: len(kept) - cap // 2], kept[len(kept) - cap // 2 :]
        doomed += old[1::2]
        kept = old[::2] + new
    return doomed


def prune(store: MetadataStore, settings: MetadataRetentionSettings) -> Pruned:
    """One retention pass over every run's rows; returns what it deleted."""
    out = Pruned()
    out.metrics = _thin_metrics(store, settings.metric_points_per_series)
    out.policy_versions = _thin_versions(store, settings.version_rows_per_run)
    out.events = _keep_newest(
        store,
        Event.id,
        (Event.run_id, Event.robot_id, Event.kind),
        settings.events_per_kind,
        ~_by_a_person(),
    )
    out.leases = _keep_newest(
        store,
        Lease.id,
        (Lease.run_id, Lease.robot_id),
        settings.released_leases_per_robot,
        Lease.released_at.is_not(None),
    )
    out.checkpoints = _keep_newest(
        store, Checkpoint.id, (Checkpoint.run_id,), settings.checkpoint_rows_per_run, None
    )
    if out.total():
        log.info("metadata retention deleted %s", out)
    return out


# Actors that are people (dashboard sessions and API tokens are ``user:<name>``; ``cli`` is a
# person at a terminal; ``anonymous`` a refused login): their events are the audit log.
PERSON_ACTORS = ("cli", "anonymous")


def _by_a_person() -> ColumnElement[bool]:
    return Event.actor.startswith("user:") | Event.actor.in_(PERSON_ACTORS)


def _groups_over(
    s: Session,
    key: Sequence[InstrumentedAttribute[Any]],
    cap: int,
    where: ColumnElement[bool] | None,
) -> list[tuple[Any, ...]]:
    q = select(*key).group_by(*key).having(func.count() > cap)
    if where is not None:
        q = q.where(where)
    return [tuple(row) for row in s.execute(q)]


def _match(key: Sequence[InstrumentedAttribute[Any]], values: Sequence[Any]) -> list[Any]:
    # NULL never equals NULL in SQL: a group whose robot is None needs IS NULL.
    return [c.is_(None) if v is None else c == v for c, v in zip(key, values, strict=True)]


def _delete_ids(s: Session, id_col: InstrumentedAttribute[int], ids: Sequence[int]) -> int:
    table = id_col.class_
    for i in range(0, len(ids), BATCH):
        s.execute(delete(table).where(id_col.in_(ids[i : i + BATCH])))
    return len(ids)


def _keep_newest(
    store: MetadataStore,
    id_col: InstrumentedAttribute[int],
    key: Sequence[InstrumentedAttribute[Any]],
    keep: int,
    where: ColumnElement[bool] | None,
) -> int:
    """Delete all but the newest ``keep`` rows (by id) of each ``key`` group (among ``where``)."""
    with store.session() as s:
        groups = _groups_over(s, key, keep, where)
    deleted = 0
    for values in groups:
        with store.session() as s:
            q = select(id_col).where(*_match(key, values)).order_by(id_col.desc()).offset(keep)
            if where is not None:
                q = q.where(where)
            deleted += _delete_ids(s, id_col, list(s.scalars(q)))
    return deleted


def _thin_metrics(store: MetadataStore, cap: int) -> int:
    key = (Metric.run_id, Metric.name, Metric.robot_id, Metric.task)
    with store.session() as s:
        groups = _groups_over(s, key, cap, None)
    deleted = 0
    for values in groups:
        with store.session() as s:
            ids = list(s.scalars(select(Metric.id).where(*_match(key, values)).order_by(Metric.id)))
            deleted += _delete_ids(s, Metric.id, thinned(ids, cap))
    return deleted


def _thin_versions(store: MetadataStore, cap: int) -> int:
    key = (PolicyVersion.run_id,)
    with store.session() as s:
        groups = _groups_over(s, key, cap, None)
    deleted = 0
    for (run_id,) in groups:
        with store.session() as s:
            rows = s.execute(
                select(PolicyVersion.id, PolicyVersion.promoted)
                .where(PolicyVersion.run_id == run_id)
                .order_by(PolicyVersion.version, PolicyVersion.id)
            ).all()
            doomed = thinned([i for i, promoted in rows if not promoted], cap)
            deleted += _delete_ids(s, PolicyVersion.id, doomed)
    return deleted
