"""Which stored steps a read keeps: the one row filter of the buffer's ``select`` and
``mount``, its shards and a run's offline sources (``foundation.runspec.OfflineSource``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class RowFilter:
    """A filter of stored steps; the given fields combine with AND, the defaults keep all.

    Attributes:
        tasks: task names kept.
        robot_ids: robot ids kept.
        run_ids: run ids kept.
        policy_versions: an inclusive ``(min, max)`` tuple, or a list of the versions kept.
        interventions_only: operator steps only (``is_intervention``).
        success_only: steps of episodes marked a success.
        time_range: ``(t0, t1)`` seconds on the steps' ``timestamp`` (since their
            episode's start), inclusive.

    Raises:
        ValueError: ``time_range`` ends before it starts.
    """

    tasks: tuple[str, ...] | None = None
    robot_ids: tuple[str, ...] | None = None
    run_ids: tuple[str, ...] | None = None
    policy_versions: tuple[int, int] | list[int] | None = None
    interventions_only: bool = False
    success_only: bool = False
    time_range: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        for name in ("tasks", "robot_ids", "run_ids"):
            names = getattr(self, name)
            if names is not None and not isinstance(names, tuple):
                object.__setattr__(self, name, tuple(names))
        t = self.time_range
        if t is not None:
            if not isinstance(t, tuple):
                object.__setattr__(self, "time_range", t := (t[0], t[1]))
            if float(t[1]) < float(t[0]):
                raise ValueError(f"time_range {t}: the end is before the start")

    def given(self) -> dict[str, Any]:
        """The fields that filter anything (not None, not False), by name (provenance)."""
        return {k: v for k, v in asdict(self).items() if v is not None and v is not False}
