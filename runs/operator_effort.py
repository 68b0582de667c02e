"""A run's operator time and return on human effort (Fleet-DAgger): autonomous successes per
operator minute.

Operator time is the time the run's people are busy: with ``help.operators`` set, from each
assignment of a help request to its release (``foundation.store.help_assignments``); with
none set, a person stands at each robot for the whole run (robots x run time). Autonomous
successes are the robots' own counts (``autonomous/<task>/successes`` in their heartbeats,
``runs.human_cost``). Each record goes to ``effort.jsonl`` in the run directory (the report's
effort over time) and to the run's metrics (``operator_minutes``, ``autonomous_successes``,
``return_on_human_effort``); each record also counts the run's help requests.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from foundation.store.help_assignments import operator_seconds, return_on_effort
from foundation.store.help_requests import figures as help_figures
from foundation.store.metadata_store import MetadataStore
from foundation.store.metrics import insert_metrics
from runs.assignments import robot_views
from runs.human_cost import human_cost
from runs.progress import append_record


def effort_figures(
    operators: int | None, robots: int, elapsed_s: float, busy_s: float, successes: float
) -> dict[str, Any]:
    """``operators`` (people; None: one per robot), ``operator_minutes``,
    ``autonomous_successes`` and ``return_on_human_effort`` (successes per operator minute,
    None without operator time). ``busy_s``: seconds assigned people were busy (used when
    ``operators`` is set); ``elapsed_s``: the run's time (a dedicated person's)."""
    dedicated = operators is None
    seconds = robots * elapsed_s if dedicated else busy_s
    return {
        "operators": robots if dedicated else operators,
        "dedicated": dedicated,
        "operator_minutes": round(seconds / 60.0, 4),
        "autonomous_successes": successes,
        "return_on_human_effort": return_on_effort(successes, seconds),
    }


class OperatorEffort:
    """Records one run's effort figures (module docstring).

    Args:
        store / run_id / run_dir: the run.
        operators: the run's ``help.operators``.
    """

    def __init__(
        self, store: MetadataStore, run_id: str, run_dir: Path, operators: int | None
    ) -> None:
        self.store, self.run_id, self.run_dir = store, run_id, run_dir
        self.operators = operators

    def record(self, elapsed_s: float, robots: list[str], env_steps: int) -> dict[str, Any]:
        """Write one record from the robots' (by name) last heartbeats; returns it."""
        stats = {name: v.stats for name, v in robot_views(self.store, robots).items()}
        return self.write(elapsed_s, len(robots), env_steps, stats)

    def write(
        self,
        elapsed_s: float,
        robots: int,
        env_steps: int,
        stats: Mapping[str, Mapping[str, Any]],
    ) -> dict[str, Any]:
        """One record from robot name -> heartbeat statistics (the final reports at the
        run's end); returns it."""
        successes = float(human_cost(stats)["total"]["autonomous_successes"])
        busy = operator_seconds(self.store, self.run_id)
        row = {
            "wall_s": elapsed_s,
            **effort_figures(self.operators, robots, elapsed_s, busy, successes),
            "help_requests": int(help_figures(self.store, self.run_id)["requests"] or 0),
        }
        append_record(self.run_dir / "effort.jsonl", row)
        points = [
            {"name": k, "step": env_steps, "value": row[k]}
            for k in ("operator_minutes", "autonomous_successes", "return_on_human_effort")
            if row[k] is not None
        ]
        insert_metrics(self.store, self.run_id, points)
        return row
