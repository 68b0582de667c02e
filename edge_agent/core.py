"""Every seam of the edge agent in one file; read this first.

One control step of :class:`edge_agent.agent.EdgeAgent`, in full::

    # pause / e-stop?  Holds (edge_agent.holds) wait; an e-stop closes the episode
    if applier.due(frame): applier.apply()              # WeightApplier (edge_agent.weights):
                                                        #   swap only at a safe boundary
    proposed, version = runner.act(obs, task_index)     # PolicyRunner: local policy or cloud Act
    applier.account(version)                            #   version_lag / apply_delay
    op = operator.step(obs, proposed)                   # InterventionSource: expert/keyboard/pad
    command = op.action if op.is_intervention else proposed
    executed = driver.send_action({"action": command})  # ControlledRobot: what it REALLY did
    next_obs = driver.get_observation()                 # (hal RobotDriver implements it)
    recorder.record(...)                                # EpisodeRecorder (edge_agent.recording):
                                                        #   row one step late -> uplink.submit
                                                        #   -> durable spool (seq) -> Uploader
    clock.wait_next(...)                                # StepClock (edge_agent.pacing)

Around the steps: an episode starts with ``applier.apply()`` (always a safe boundary) and
``driver.reset(task=...)``, takes its ``episode_index`` from the EpisodeLog
(edge_agent.episodes) and ends with ``recorder.close(final_obs)``. While the agent runs, a
:class:`~edge_agent.heartbeat.HeartbeatLoop` sends :data:`Heartbeat` every
``heartbeat_interval_s``; new versions appear in a :class:`WeightSource` (the applier's
source).

Shapes: ``observation.state`` is ``(D,) float32``; ``observation.images.<cam>`` is
``(H, W, C) uint8``; ``action`` is ``(A,) float32``. A policy may return a chunk ``(T, A)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

Observation = dict[str, Any]

DEMONSTRATION = 0
"""``policy_version`` of the steps of a demonstration episode: the operator drove the robot
and no policy was consulted (versions of a run start at 1; -1 is a safe hold). The cloud counts
a run's demonstrations by it (``buffer.service.batches``)."""

Heartbeat = Callable[[str, int, Mapping[str, float]], object]
"""``(state, applied_version, stats) -> anything``: one report to the cloud (comms'
``EdgeClient.heartbeat``). ``state`` is ``running`` / ``paused`` / ``estopped`` / ``stopped`` /
``idle``; ``stats`` is :meth:`edge_agent.agent.EdgeAgent.report`."""


class EpisodeView(Protocol):
    """The robot's view of its current episode (hal's ``EpisodeState``): Gymnasium's step
    outcome after the last ``send_action``. A driver with its own teleoperation device may
    also expose ``info = {"is_intervention": bool}``."""

    reward: float
    terminated: bool
    truncated: bool
    success: bool


@runtime_checkable
class ControlledRobot(Protocol):
    """The robot the agent controls, shaped like LeRobot's ``Robot`` (hal's ``RobotDriver``
    implements it).

    ``observation_features`` / ``action_features`` are LeRobot feature dicts known before
    ``connect``. ``reset(task=...)`` starts an episode and returns its first observation;
    ``get_observation`` returns ``{feature key: np.ndarray}``; ``send_action({"action": a})``
    returns ``{"action": what was really sent}`` (after clipping) and updates ``episode``.
    """

    episode: Any

    @property
    def observation_features(self) -> Mapping[str, Any]: ...

    @property
    def action_features(self) -> Mapping[str, Any]: ...

    @property
    def control_hz(self) -> float: ...

    def connect(self) -> None: ...

    def disconnect(self) -> None: ...

    def reset(self, task: str | None = None, seed: int | None = None) -> Observation: ...

    def get_observation(self) -> Observation: ...

    def send_action(self, action: Any) -> Any: ...

    def estop(self) -> None: ...

    def is_healthy(self) -> bool: ...


@runtime_checkable
class PolicyRunner(Protocol):
    """Produces the novice's action for one control step.

    ``act`` returns ``(action (A,) float32, policy_version)``; ``policy_version`` is -1 when no
    policy produced the action (the remote runner's safe hold after a missed deadline).
    ``at_chunk_boundary`` is True when the next ``act`` starts a new action chunk (always True
    for single-action policies); weights may be swapped only there or at episode end.
    """

    @property
    def policy_version(self) -> int: ...

    @property
    def at_chunk_boundary(self) -> bool: ...

    def act(self, observation: Observation, task: int) -> tuple[np.ndarray, int]: ...

    def set_weights(self, version: int, weights: Mapping[str, Any]) -> None: ...

    def reset(self) -> None: ...


@dataclass
class OperatorInput:
    """What an intervention source decided for one step.

    Attributes:
        is_intervention: the operator, not the policy, chose this step's action.
        action: the operator's action ``(A,) float32`` (None when not intervening).
        command: an episode command: ``"rerecord"`` (end this episode, never train on it,
            record its task again), ``"discard"`` (end it, never train on it), ``"success"``
            / ``"failure"`` (operator's label, ends the episode), ``"estop"``; None for none.
        reason: why the source intervened (``"divergence"``, ``"risk_region"``, ``"handback"``,
            ``"key"``, ``"button"``...), for logs and tests.
    """

    is_intervention: bool = False
    action: np.ndarray | None = None
    command: str | None = None
    reason: str = ""


@runtime_checkable
class InterventionSource(Protocol):
    """A human (or the simulated operator) who may take over any step."""

    def step(self, observation: Observation, proposed: np.ndarray) -> OperatorInput: ...

    def reset(self) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class ReadySource(Protocol):
    """An intervention source through which a person says the cell is set up again, for
    robots that cannot reset themselves (:mod:`edge_agent.resets`). Optional: the hold polls
    sources that have these methods (the keyboard's Enter, the gamepad's start button, a
    simulated person after a delay).

    ``reset_begins()`` is called once when a reset hold starts (drop presses made during the
    episode; a simulated person starts its timer); ``ready()`` is polled while holding and is
    True once the person has signalled ready since ``reset_begins``.
    """

    def reset_begins(self) -> None: ...

    def ready(self) -> bool: ...


class WeightSource(Protocol):
    """Where new weights appear: ``current() -> (version, {name: tensor})``, version -1 = none.

    ``comms.robot.receiver.WeightReceiver`` is one; :class:`edge_agent.weights.StagedWeights` is the
    in-process one. Called from the control loop; offered from any thread.
    """

    def current(self) -> tuple[int, Mapping[str, Any]]: ...
