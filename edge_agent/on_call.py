"""A simulated person on call: the run has fewer people than robots (``help.operators``).

The cloud assigns a robot's help request to one of the run's operators
(``foundation.store.help_assignments``) and tells the robot on its Control stream
(``help_answered`` with outcome ``took_over``, :meth:`edge_agent.help.HelpDesk.answered`).
Only then does :class:`OnCallPerson` drive the robot: the scripted expert acts (no gate: the
person was called in to take over) for the rest of the episode or ``max_steps`` steps, then
hands back; the help desk reports the request closed and the cloud frees the operator. At
all other steps nobody takes over. The person's verdicts on episodes (the labels a blind
robot's success comes from) are given as :class:`~edge_agent.simulated_person.SimulatedPerson`
gives them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edge_agent.core import Observation, OperatorInput
from edge_agent.help import HelpDesk
from edge_agent.simulated_person import SimulatedPerson


class OnCallPerson:
    """``person`` acting only while ``desk`` says the cloud assigned someone (module doc).

    Args:
        person: the simulated person (its scripted expert drives; its verdicts label).
        desk: the robot's help desk (``assigned``: a person from the cloud took over).
        max_steps: steps one takeover lasts at most (None: the rest of the episode).

    Raises:
        ValueError: ``max_steps`` below 1.
    """

    def __init__(self, person: SimulatedPerson, desk: HelpDesk, max_steps: int | None) -> None:
        if max_steps is not None and max_steps < 1:
            raise ValueError(f"an on-call takeover lasts at least one step, got {max_steps}")
        self.person = person
        self.desk = desk
        self.max_steps = max_steps
        self.steps = 0  # steps driven in the current takeover
        self.takeovers = 0

    def step(self, observation: Observation, proposed: np.ndarray) -> OperatorInput:
        op = OperatorInput()
        if self.desk.assigned and (self.max_steps is None or self.steps < self.max_steps):
            if self.steps == 0:
                self.takeovers += 1
            self.steps += 1
            drive = self.person.hands.demonstrate(observation)
            op = OperatorInput(True, drive.action, None, "on call")
        elif not self.desk.assigned:
            self.steps = 0  # handed back: the next assignment starts a fresh takeover
        return self.person.with_verdict(op)

    def demonstrate(self, observation: Observation) -> OperatorInput:
        return self.person.demonstrate(observation)

    def review(self, proposed: str) -> str | None:
        return self.person.review(proposed)

    def reset_begins(self) -> None:
        self.person.reset_begins()

    def ready(self) -> bool:
        return self.person.ready()

    def reset(self) -> None:
        self.steps = 0
        self.person.reset()

    def close(self) -> None:
        self.person.close()

    def __getattr__(self, name: str) -> Any:  # other figures of the person (labels, ...)
        return getattr(self.person, name)
