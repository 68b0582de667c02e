"""Metadata retention settings (the ``metadata:`` section, ``ROBOFLEET_METADATA__*``)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class MetadataRetentionSettings(BaseModel):
    """How many rows the append-only metadata tables keep (``foundation.store.retention``).

    A run that lasts days writes metric points, events, version and checkpoint rows without
    end; these caps keep each table bounded while keeping every curve's whole span (old points
    are thinned, not cut) and every person's audit event.
    """

    every_s: float = Field(
        default=60.0, gt=0, description="Seconds between two retention passes of the cloud."
    )
    metric_points_per_series: int = Field(
        default=20_000,
        ge=16,
        description=(
            "Points one metric series (run, name, robot, task) keeps. Past it, every other point "
            "of its older half is deleted: the newest half keeps full resolution and the curve "
            "keeps its start, at half the resolution each time it is thinned."
        ),
    )
    events_per_kind: int = Field(
        default=2_000,
        ge=1,
        description=(
            "Machine events (the cloud, its run manager, robots) kept per (run, robot, kind), "
            "newest first. Events a person caused (actor user:NAME, cli, anonymous) are the "
            "audit log and are never deleted."
        ),
    )
    released_leases_per_robot: int = Field(
        default=20,
        ge=0,
        description="Released leases kept per (run, robot), newest first; active leases always.",
    )
    checkpoint_rows_per_run: int = Field(
        default=100,
        ge=1,
        description=(
            "Checkpoint rows kept per run, newest first (the learner keeps only its last few "
            "checkpoint directories on disk)."
        ),
    )
    version_rows_per_run: int = Field(
        default=5_000,
        ge=16,
        description=(
            "Policy version rows one run keeps; past it the older half is thinned like metric "
            "points. Promoted versions are kept beyond the cap."
        ),
    )
