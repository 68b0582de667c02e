"""The running state of one episode in the edge agent's control loop (``edge_agent.agent``)."""

from __future__ import annotations

from dataclasses import dataclass

from edge_agent.core import Observation
from edge_agent.pacing import StepClock
from edge_agent.recording import EpisodeRecorder


@dataclass
class Episode:
    """The running state of one episode, advanced step by step."""

    task: str
    task_index: int
    index: int
    recorder: EpisodeRecorder
    clock: StepClock
    obs: Observation
    frame: int = 0
    label: str | None = None  # the operator's: success / failure / rerecord / discard
    label_by: str = ""  # who gave it: the intervention source, or the cloud's reason
    evaluating: bool = False  # a policy-only evaluation episode (edge_agent.evaluation)
    demonstrating: bool = False  # the operator drives it; no policy (module docstring)
    succeeded: bool = False  # the driver signalled success during the episode
    intervened: bool = False
