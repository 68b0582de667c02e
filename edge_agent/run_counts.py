"""The counts a robot keeps for one run, across the agents that serve it: evaluation and
autonomous outcomes (:class:`edge_agent.evaluation.SuccessTally`) and the human cost
(:class:`edge_agent.human_cost.HumanCost`).

A robot computer that restarts, or is released and assigned to the same run again, builds a
new agent on the run's spool directory; it takes the counts up where the last one saved them,
under the same ``tally_epoch``, so the run's success curve and its human cost cover the whole
run, not the time since the last restart. ``counts.json`` in that directory holds
``{"epoch": float, "tally": {key: float}, "human": {key: float}}``, written atomically and
durably at the end of every episode and, while a person acts (a takeover, a reset), every
``SAVE_EVERY_S`` seconds (:func:`foundation.durable.atomic_write_text`). What was counted in
the seconds after the last save and before a crash is lost; the cloud takes a count that fell
under an unchanged epoch as no increment (``runs.robot_evals``).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from edge_agent.evaluation import SuccessTally
from edge_agent.human_cost import HumanCost
from foundation.durable import atomic_write_text

log = logging.getLogger(__name__)

FILE = "counts.json"
SAVE_EVERY_S = 10.0  # while counting goes on between episode ends (a long takeover or reset)


class RunCounts:
    """A robot's outcome tally and human cost for one run, kept in ``directory``.

    Args:
        directory: the run's spool directory on the robot computer.
        period: seconds per control step (``HumanCost``).
    """

    def __init__(self, directory: Path, period: float) -> None:
        self._file = Path(directory) / FILE
        self.tally = SuccessTally()
        self.human = HumanCost(period)
        self._saved_at = time.monotonic()
        self._restore()

    def _restore(self) -> None:
        if not self._file.exists():
            return
        try:
            saved = json.loads(self._file.read_text())
            epoch = float(saved["epoch"])
            tally = {str(k): float(v) for k, v in dict(saved["tally"]).items()}
            human = {str(k): float(v) for k, v in dict(saved["human"]).items()}
        except (ValueError, KeyError, TypeError) as exc:
            # Counting from zero under a new epoch is right, only less complete: the cloud
            # takes the new counts whole.
            log.warning("%s unreadable (%s): the run's counts start again", self._file, exc)
            return
        self.tally.epoch = epoch
        self.tally.counts.update(tally)
        self.human.counts.update(human)

    def save(self) -> None:
        """Keep the counts so far (at an episode's end).

        Raises:
            OSError: the file could not be written (a full disk).
        """
        state = {
            "epoch": self.tally.epoch,
            "tally": dict(self.tally.counts),
            "human": dict(self.human.counts),
        }
        atomic_write_text(self._file, json.dumps(state))
        self._saved_at = time.monotonic()

    def step(self, task: str, intervening: bool) -> None:
        """A control step (``HumanCost.step``); saved when ``SAVE_EVERY_S`` have passed."""
        self.human.step(task, intervening)
        self._keep()

    def reset_time(self, seconds: float) -> None:
        """``seconds`` more of a reset (``HumanCost.reset_time``); saved when due."""
        self.human.reset_time(seconds)
        self._keep()

    def _keep(self) -> None:
        if time.monotonic() - self._saved_at < SAVE_EVERY_S:
            return
        try:
            self.save()
        except OSError as exc:  # the episode's end tries again; the robot keeps acting
            self._saved_at = time.monotonic()
            log.warning("%s not saved (%s); the counts are kept in memory", self._file, exc)

    def report(self) -> dict[str, float]:
        """Both parts' heartbeat statistics."""
        return {**self.tally.report(), **self.human.report()}
