"""The simulated person at a simulated robot that hides its reward and success.

A real arm reports no success: a person at the robot sees the task done and presses ``y``
(or sees the episode run out and presses ``n``), reviews what a reward classifier proposed,
and puts the scene back before saying "ready". On a simulated robot that hides its verdict
(``hal.drivers.metaworld``'s ``detects_success=False``) this class plays that person: it
takes over like :class:`~edge_agent.operators.ScriptedOperator` (the scripted expert behind
HG-DAgger's gate) and looks at the scene through ``sees_success`` (the simulator's ground
truth, kept aside by the driver), which robofleet itself never reads.

It labels the first ``labelled_episodes`` episodes it watches (None: all), as a lab whose
people label for a while and then leave the robot to the classifier; its reviews of a
classifier's proposals (:meth:`review`) continue after that.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from edge_agent.core import Observation, OperatorInput
from edge_agent.operators import ScriptedOperator


class SimulatedPerson:
    """A scripted operator who also gives verdicts, reviews proposals and resets the scene.

    Args:
        hands: the takeover part (the scripted expert behind the gate).
        sees_success: True while the task is visibly solved in the scene (the simulator's
            ground truth; for simulated people and measurement only).
        episode_steps: episode length in steps: at the last step of an episode in which
            it saw no success the person says ``failure``. None: it never does.
        labelled_episodes: episodes to label (None: every one).
        ready_after_s: seconds the person takes to put the scene back (:meth:`ready`).
    """

    def __init__(
        self,
        hands: ScriptedOperator,
        sees_success: Callable[[], bool],
        episode_steps: int | None,
        labelled_episodes: int | None = None,
        ready_after_s: float = 1.0,
    ) -> None:
        self.hands = hands
        self.sees_success = sees_success
        self.episode_steps = episode_steps
        self.labelled_episodes = labelled_episodes
        self.ready_after_s = ready_after_s
        self.episodes = 0
        self.labels = 0
        self._frame = 0
        self._ended_at: float | None = None

    @classmethod
    def watching(
        cls,
        driver: Any,
        hands: ScriptedOperator,
        episode_steps: int | None,
        labelled_episodes: int | None = None,
        ready_after_s: float = 1.0,
    ) -> SimulatedPerson:
        """The person at ``driver``, seeing success in its ``ground_truth`` (hal's
        Meta-World ``GroundTruth``; None before the first episode)."""

        def sees_success() -> bool:
            gt = driver.ground_truth
            return bool(gt is not None and gt.success)

        return cls(hands, sees_success, episode_steps, labelled_episodes, ready_after_s)

    @property
    def labelling(self) -> bool:
        """The person labels the current episode."""
        return self.labelled_episodes is None or self.episodes <= self.labelled_episodes

    def step(self, observation: Observation, proposed: np.ndarray) -> OperatorInput:
        op = self.hands.step(observation, proposed)
        return self.with_verdict(op)

    def demonstrate(self, observation: Observation) -> OperatorInput:
        return self.with_verdict(self.hands.demonstrate(observation))

    def with_verdict(self, op: OperatorInput) -> OperatorInput:
        """``op`` (this step's input) with the person's verdict on the episode, if any:
        ``success`` once the scene shows it, ``failure`` at the episode's last step."""
        frame, self._frame = self._frame, self._frame + 1
        if not self.labelling:
            return op
        verdict = None
        if self.sees_success():
            verdict = "success"
        elif self.episode_steps is not None and frame + 1 >= self.episode_steps:
            verdict = "failure"
        if verdict is None:
            return op
        self.labels += 1
        return OperatorInput(op.is_intervention, op.action, verdict, op.reason)

    def review(self, proposed: str) -> str | None:
        """The person's word on a proposed verdict (a classifier's ``success``): the
        opposite verdict when the scene disagrees, None when it agrees."""
        seen = "success" if self.sees_success() else "failure"
        if seen == proposed:
            return None
        self.labels += 1
        return seen

    def reset_begins(self) -> None:
        """The robot holds for its reset (``edge_agent.resets``): the person puts the scene
        back from now on and says :meth:`ready` ``ready_after_s`` later."""
        self._ended_at = time.monotonic()

    def ready(self) -> bool:
        """The scene is back in place: ``ready_after_s`` after the reset hold began."""
        return self._ended_at is None or time.monotonic() - self._ended_at >= self.ready_after_s

    def reset(self) -> None:
        self.hands.reset()
        self.episodes += 1
        self._frame = 0
        self._ended_at = None

    def close(self) -> None:
        self.hands.close()
