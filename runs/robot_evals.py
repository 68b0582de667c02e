"""A run's success measured on its robots (``evaluation.on: robots``): no simulator needed.

Each robot runs policy-only evaluation episodes on the run's schedule and counts them, with
its autonomous training episodes, in its heartbeat statistics (``edge_agent.evaluation``:
cumulative ``eval/<task>/episodes`` and ``eval/<task>/successes`` ...). At each evaluation
tick :class:`RobotEvaluations` takes the increments since the previous point, over every robot
of the run (a robot computer that restarted counts from zero again: its new count is the
increment), and once every task of the run has at least one new evaluation episode writes a
point of the success curve: a row of ``evals.jsonl`` (``source: robots``), ``success_rate``
metrics per task, the run's ``success`` figures. Until then increments accumulate. The
autonomous success of training episodes goes beside it in each row (``autonomous``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import select

from foundation.store.models import Robot
from foundation.store.store import MetadataStore
from runs.clock import RunClock
from runs.evaluations import record_point

KINDS = ("eval", "autonomous")


class RobotEvaluations:
    """The success curve of one run from its robots' evaluation episodes.

    Same calls as :class:`runs.evaluations.RunEvaluations`, so the
    run driver drives either.

    Args:
        store / run_id / run_dir: the run.
        tasks: the run's tasks (a point needs a new evaluation episode of each).
        robots: the names of the run's robots now (called at every tick).
        on_event: records an event of the run (``kind, **data``).
    """

    def __init__(
        self,
        store: MetadataStore,
        run_id: str,
        run_dir: Path,
        tasks: Sequence[str],
        robots: Callable[[], list[str]],
        on_event: Callable[..., None],
    ) -> None:
        self.store, self.run_id, self.run_dir = store, run_id, run_dir
        self.tasks = list(tasks)
        self.robots = robots
        self.on_event = on_event
        self.last_at = -1e9
        self._seen: dict[tuple[str, str], float] = {}  # (robot, counter) -> last value
        self._pending: dict[str, float] = defaultdict(float)  # counter -> increment
        self._ready: list[dict[str, Any]] = []

    def snapshot(
        self,
        version: int,
        weights: bytes,
        clock: RunClock,
        counts: Callable[[], tuple[int, int]],
        final: bool = False,
    ) -> None:
        """Take the robots' increments now; a point when every task has new evaluations."""
        import time

        self.last_at = time.monotonic()
        self._take_increments()
        p = self._pending
        if not all(p.get(f"eval/{t}/episodes", 0.0) > 0 for t in self.tasks):
            return
        steps, interventions = counts()
        success = {t: p[f"eval/{t}/successes"] / p[f"eval/{t}/episodes"] for t in self.tasks}
        autonomous = {
            t: p[f"autonomous/{t}/successes"] / p[f"autonomous/{t}/episodes"]
            for t in self.tasks
            if p.get(f"autonomous/{t}/episodes", 0.0) > 0
        }
        mean = sum(success.values()) / len(success)
        self._ready.append(
            {
                "wall_s": clock.elapsed(),
                "robot_hours": clock.robot_hours,
                "env_steps": steps,
                "interventions": interventions,
                "policy_version": version,
                "success": success,
                "success_mean": mean,
                "episodes": {t: int(p[f"eval/{t}/episodes"]) for t in self.tasks},
                "autonomous": autonomous,
                "source": "robots",
            }
        )
        self._pending.clear()

    def _take_increments(self) -> None:
        names = self.robots()
        with self.store.session() as s:
            rows = s.execute(select(Robot.name, Robot.stats).where(Robot.name.in_(names)))
            stats = {name: dict(st or {}) for name, st in rows}
        for name, st in stats.items():
            if st.get("run_id") != self.run_id:
                continue  # not (yet, or no longer) in this run: its counts are another's
            for key, value in st.items():
                if not isinstance(value, int | float) or key.split("/")[0] not in KINDS:
                    continue
                if key == "eval/version":
                    continue
                last = self._seen.get((name, key), 0.0)
                # A restarted robot computer counts from zero: its value is the increment.
                self._pending[key] += value - last if value >= last else value
                self._seen[(name, key)] = float(value)

    def collect(self, wait: bool = False) -> dict[str, Any] | None:
        """Record the next point, if there is one; returns the run's figures it changes."""
        if not self._ready:
            return None
        row = self._ready.pop(0)
        record_point(self.store, self.run_id, self.run_dir, row, self.on_event, source="robots")
        return {
            "success": row["success"],
            "success_mean": row["success_mean"],
            "eval_version": row["policy_version"],
            "autonomous_success": row["autonomous"],
        }

    def drain(self) -> list[dict[str, Any]]:
        out = []
        while self._ready:
            got = self.collect()
            if got is not None:
                out.append(got)
        return out

    def close(self) -> None:
        """Nothing runs in the background."""
