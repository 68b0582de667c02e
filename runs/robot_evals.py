"""A run's success measured on its robots (``evaluation.on: robots``): no simulator needed.

Each robot runs policy-only evaluation episodes on the run's schedule and counts them, with
its autonomous training episodes, in its heartbeat statistics (``edge_agent.evaluation``:
cumulative ``eval/<task>/episodes`` and ``eval/<task>/successes`` ...). At each evaluation
tick :class:`RobotEvaluations` takes the increments since the previous point, over every robot
of the run. A robot's counts cover the whole run across its agents (``edge_agent.run_counts``);
a robot that counts from zero again shows a new ``tally_epoch``, and its new counts are the
increment. Once every task of the run has at least one new evaluation episode it makes a
point of the success curve (``source: robots``, and ``scored_by``: its evaluation episodes by
who decided their outcome: the robots' ``driver``, an ``operator``, the ``classifier``), which
:mod:`runs.eval_record` records. Until then increments accumulate. The autonomous success of training episodes goes beside it in
each row (``autonomous``).
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

from sqlalchemy import select

from edge_agent.evaluation import EPOCH_KEY
from foundation.durable import atomic_write_text
from foundation.store.metadata_store import MetadataStore
from foundation.store.models import Robot
from runs.eval_record import EvalPoint, Stamp

KINDS = ("eval", "autonomous")
STATE_FILE = "robot_evals.json"

log = logging.getLogger(__name__)


class RobotEvaluations:
    """The success curve of one run from its robots' evaluation episodes (an evaluation
    source of :class:`runs.eval_record.EvaluationRecorder`).

    Args:
        store / run_id: the run.
        tasks: the run's tasks (a point needs a new evaluation episode of each).
        robots: the names of the run's robots now (called at every tick).
        run_dir: where what the points so far took of each robot's counts is kept
            (``robot_evals.json``, at every point), so that a resumed run counts on from there
            instead of taking the robots' counts, which cover the whole run, whole again.
            None: kept in memory only.
    """

    def __init__(
        self,
        store: MetadataStore,
        run_id: str,
        tasks: Sequence[str],
        robots: Callable[[], list[str]],
        run_dir: Path | None = None,
    ) -> None:
        self.store, self.run_id = store, run_id
        self.tasks = list(tasks)
        self.robots = robots
        self._seen: dict[tuple[str, str], float] = {}  # (robot, counter) -> last value
        self._pending: dict[str, float] = defaultdict(float)  # counter -> increment
        self._ready: list[EvalPoint] = []
        self._epochs: dict[str, object] = {}  # robot -> the epoch of its counts (EPOCH_KEY)
        self._file = None if run_dir is None else run_dir / STATE_FILE
        self._load()

    def offer(
        self, version: int, weights: bytes, stamp: Callable[[], Stamp], final: bool
    ) -> int | None:
        """Take the robots' increments now; a point when every task has new evaluations.
        Nothing is ever dropped (None)."""
        self._take_increments()
        p = self._pending
        if not all(p.get(f"eval/{t}/episodes", 0.0) > 0 for t in self.tasks):
            return None
        success = {t: p[f"eval/{t}/successes"] / p[f"eval/{t}/episodes"] for t in self.tasks}
        autonomous = {
            t: p[f"autonomous/{t}/successes"] / p[f"autonomous/{t}/episodes"]
            for t in self.tasks
            if p.get(f"autonomous/{t}/episodes", 0.0) > 0
        }
        extra = {
            "episodes": {t: int(p[f"eval/{t}/episodes"]) for t in self.tasks},
            "autonomous": autonomous,
            "source": "robots",
            "scored_by": self._scorers(),
        }
        self._ready.append(EvalPoint(stamp(), version, success, extra, weights=weights))
        self._pending.clear()
        self._save()
        return None

    def _load(self) -> None:
        if self._file is None or not self._file.exists():
            return
        try:
            state = json.loads(self._file.read_text())
            seen = {(str(r), str(k)): float(v) for r, k, v in state["seen"]}
            epochs = {str(r): e for r, e in dict(state["epochs"]).items()}
        except (ValueError, KeyError, TypeError) as exc:
            # Written atomically, so only a hand or a foreign tool makes it so: the run goes
            # on, and its next point may count again what earlier points counted.
            log.warning("%s unreadable (%s): robots' counts are taken whole", self._file, exc)
            return
        self._seen, self._epochs = seen, epochs

    def _save(self) -> None:
        if self._file is None:
            return
        seen = [[r, k, v] for (r, k), v in sorted(self._seen.items())]
        atomic_write_text(self._file, json.dumps({"seen": seen, "epochs": self._epochs}))

    def _scorers(self) -> dict[str, int]:
        """Evaluation episodes of the pending increments by who scored them (``driver``,
        ``operator``, ``classifier``, ``unscored``: ``edge_agent.evaluation.scored_by``)."""
        out: dict[str, int] = defaultdict(int)
        for key, n in self._pending.items():
            parts = key.split("/")
            if len(parts) == 4 and parts[0] == "eval" and parts[2] == "by" and n > 0:
                out[parts[3]] += int(n)
        return dict(sorted(out.items()))

    def _take_increments(self) -> None:
        names = self.robots()
        with self.store.session() as s:
            rows = s.execute(select(Robot.name, Robot.stats).where(Robot.name.in_(names)))
            stats = {name: dict(st or {}) for name, st in rows}
        for name, st in stats.items():
            if st.get("run_id") != self.run_id:
                continue  # not (yet, or no longer) in this run: its counts are another's
            counts = {
                key: float(value)
                for key, value in st.items()
                if isinstance(value, int | float)
                and key.split("/")[0] in KINDS
                and key != "eval/version"
            }
            epoch = st.get(EPOCH_KEY)
            step = {key: value - self._seen.get((name, key), 0.0) for key, value in counts.items()}
            if epoch is None:  # an older robot computer: a fallen count says it restarted
                restarted = any(d < 0 for d in step.values()) or _more_successes(step)
            else:
                restarted = epoch != self._epochs.get(name)
            if restarted:
                # A new agent (a new robot computer, or a lost spool) counts from zero: every
                # counter of the robot is taken whole, never some whole and some as differences.
                self._epochs[name] = epoch
                self._seen = {k: v for k, v in self._seen.items() if k[0] != name}
                step = dict(counts)
            # Under one epoch a count falls only when a crash lost what was counted after the
            # agent last saved (edge_agent.run_counts): no increment, and never more successes
            # than episodes, so a point's rate stays within [0, 1].
            step = {key: max(d, 0.0) for key, d in step.items()}
            for key, d in step.items():
                if key.endswith("/successes"):
                    d = min(d, step.get(key.removesuffix("successes") + "episodes", 0.0))
                self._pending[key] += d
            for key, value in counts.items():
                self._seen[(name, key)] = value

    def poll(self, wait: bool) -> EvalPoint | None:
        """The oldest point not yet recorded (points are made by :meth:`offer`; ``wait`` has
        nothing to wait for)."""
        return self._ready.pop(0) if self._ready else None

    def pending(self) -> int:
        return len(self._ready)

    def close(self) -> None:
        """Nothing runs in the background."""


def _more_successes(step: dict[str, float]) -> bool:
    """Whether some task's successes grew by more than its episodes (``kind/task/...``)."""
    return any(
        d > step.get(key.removesuffix("successes") + "episodes", 0.0)
        for key, d in step.items()
        if key.endswith("/successes")
    )
