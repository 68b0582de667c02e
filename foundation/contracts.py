"""The seams between robofleet's packages, in one short file; read this first.

Each package owns one part of the data path and talks to its neighbours through these small
interfaces (Acme's ``core.py`` is the model), so a reader sees every seam in one place and an
implementation can be swapped without touching its callers::

    robot --hal driver--> edge_agent --steps (comms)--> buffer --TransitionSource--> learner
      ^                                                                                |
      +--------- edge_agent applies weights <--comms distributes-- WeightPublisher <---+

    dashboard --RunManager--> the cloud's run orchestration (runs)
    dashboard --RobotControl--> comms' server: an e-stop pushed to a connected robot now
    dashboard --RobotStation--> comms' server: station takeover commands out, frames back
    dashboard --EpisodeSource--> a run's buffer: its episodes viewed and labelled

Where the implementations live:

=====================  ==================================================================
contract               implementations
=====================  ==================================================================
RunManager             ``runs.manager.RunManager`` (a live cloud),
                       ``...manager.QueuedRunManager`` (requests for a cloud to act on)
RobotControl           ``comms.cloud.server.CloudServer``
RobotStation           ``comms.cloud.server.CloudServer``
EpisodeSource          ``runs.episode_view.RunEpisodes``
TransitionSource       ``buffer.service.batches.RemoteBuffer`` (the run's buffer, another process)
WeightPublisher        ``comms.cloud.weight_file.WeightDirectory`` (learner process -> cloud),
                       ``cloud_learner.publisher.InMemoryWeightPublisher`` (tests)
=====================  ==================================================================

The robot side has its own seams next to the code that runs them: the driver contract
(``hal.driver.RobotDriver``, shaped like LeRobot's ``Robot``) and the edge agent's parts
(``edge_agent.core``). The learner's (``Policy``, ``Algorithm``, ``BatchSource``) are in
``cloud_learner.core``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np

    from foundation.runspec import RunSpec


@runtime_checkable
class RunManager(Protocol):
    """What the dashboard needs from run orchestration. ``actor`` goes into audit events.

    Every method raises ``foundation.store.runs.RunNotFound`` for an unknown id and
    ``foundation.store.runs.RunStateError`` when the run's state forbids the action; on error
    nothing has changed.
    """

    def parse_spec(self, data: Any) -> RunSpec:
        """A launch request's run spec (a JSON document) checked by the floor and against
        the algorithms and policy kinds the cloud's learner has, its policy kind filled in.

        Raises:
            foundation.runspec.RunSpecError: every invalid field at once, by dotted path.
        """
        ...

    def launch(self, spec: RunSpec, *, actor: str) -> str:
        """Validate ``spec`` against the fleet, record the run and start it; returns its id.

        Raises:
            foundation.runspec.RunSpecError: the spec is valid on its own but the fleet cannot
                run it (unknown task, knob, too few robots), by dotted field path.
        """
        ...

    def stop(self, run_id: str, *, actor: str) -> None:
        """Stop the run and release its robots; it can be resumed from its last checkpoint."""
        ...

    def pause(self, run_id: str, *, actor: str) -> None:
        """Hold the robots' control loops without releasing leases (spools drain; the
        learner may go on training); ``resume`` continues on the same robots."""
        ...

    def resume(self, run_id: str, *, actor: str) -> None:
        """Continue a paused, stopped or crashed run from its last checkpoint."""
        ...

    def checkpoint_now(self, run_id: str, *, actor: str) -> None:
        """Ask the learner to write a checkpoint at its next update boundary."""
        ...

    def offline_sources(self) -> list[dict[str, Any]]:
        """What a launch can mount as offline data (``buffer.offline_data``): the data
        catalog's datasets and the runs that have a buffer, each ``{"name", "kind":
        "dataset" | "run", ...}`` with what is known cheaply (rows, episodes, tasks)."""
        ...


@runtime_checkable
class RobotControl(Protocol):
    """Pushes a command on a connected robot's Control stream."""

    def push_control(self, robot_id: int, kind: str, run_id: str = "", reason: str = "") -> bool:
        """Queue ``kind`` (``estop``, ``clear_estop``, ``pause``, ``resume``,
        ``lease_changed``, ``rerecord``, ``discard``: the last two end the robot's running
        episode and mark it never to be trained on) for the robot; False when it is not
        connected (the cloud's e-stop sync then delivers an e-stop from the metadata store).

        Raises:
            ValueError: an unknown ``kind``.
        """
        ...


class StationFrame(Protocol):
    """A robot's latest report to the operator station (``comms.cloud.services.station``):
    ``frame`` encoded as ``frame_format`` (``jpeg`` / ``png``, empty bytes: none) from camera
    ``camera``; ``taken_over`` while a station person drives it; ``echo_id`` the last station
    command a step acted on; ``note`` why a takeover ended; ``received`` monotonic seconds."""

    @property
    def run_id(self) -> str: ...
    @property
    def frame(self) -> bytes: ...
    @property
    def frame_format(self) -> str: ...
    @property
    def camera(self) -> str: ...
    @property
    def taken_over(self) -> bool: ...
    @property
    def echo_id(self) -> int: ...
    @property
    def note(self) -> str: ...
    @property
    def received(self) -> float: ...


@runtime_checkable
class RobotStation(Protocol):
    """The operator station's link to connected robots (the cloud's comms server)."""

    def push_teleop(self, robot_id: int, command: str, run_id: str = "") -> bool:
        """Queue one station command (JSON: ``edge_agent.remote``) on the robot's Control
        stream; False when the robot is not connected."""
        ...

    def station_view(self, robot_id: int) -> StationFrame | None:
        """The robot's latest report, None before any."""
        ...


class EpisodeMissing(LookupError):
    """No stored step of the episode, or no such frame or camera (``str`` says which)."""


class EpisodeRefused(RuntimeError):
    """A label that cannot apply now: the episode stays excluded, or another process holds
    its buffer (``str`` says which)."""


class EpisodesUnavailable(RuntimeError):
    """The run's buffer could not be read now (``str`` says why)."""


class EpisodeSource(Protocol):
    """A run's stored episodes, as the dashboard's episode viewer shows and labels them.
    ``run_dir``: the run's directory; ``robot_id``: the buffer's id of the robot (its fleet id
    as a string). Raises :class:`EpisodeMissing`, :class:`EpisodeRefused`,
    :class:`EpisodesUnavailable`."""

    def episodes(self, run_id: str, run_dir: str) -> list[dict[str, Any]]:
        """Every stored episode, newest first: ``robot_id``, ``episode_index``, ``task``,
        ``steps``, ``deleted_steps``, ``done``, ``label``, ``label_by``, ``interventions``."""
        ...

    def episode(self, run_id: str, run_dir: str, robot_id: str, episode: int) -> dict[str, Any]:
        """One episode's steps in frame order (``runs.episode_view.episode``)."""
        ...

    def frame(
        self, run_id: str, run_dir: str, robot_id: str, episode: int, frame: int, camera: str
    ) -> np.ndarray:
        """Camera ``camera``'s uint8 pixels (H, W, C) at step ``frame``."""
        ...

    def label(
        self, run_id: str, run_dir: str, robot_id: str, episode: int, kind: str, reason: str
    ) -> int:
        """Mark the episode ``kind`` (success, failure, discard) given by ``reason``; returns
        the rows the mark applies to now."""
        ...


@runtime_checkable
class TransitionSource(Protocol):
    """Where a learner's transitions come from: a run's replay buffer, possibly remote.

    ``sample`` returns exactly ``batch_size`` rows as numpy columns with LeRobot keys
    (``observation.state`` (B, D) float32, ``action`` (B, A) float32, ``reward`` (B,)
    float32, ``is_intervention`` (B,) bool, ... see ``buffer.service.batches``). Counts are rows:
    ``num_transitions`` everything the buffer holds, ``online_transitions`` the rows robots
    inserted (offline data excluded; samples-per-insert counts these). ``sampler_state`` is
    a JSON-able dict a checkpoint stores and hands back to ``load_sampler_state``.
    """

    def num_transitions(self) -> int: ...

    def online_transitions(self) -> int: ...

    def sample(self, batch_size: int) -> dict[str, np.ndarray]: ...

    def sampler_state(self) -> dict[str, Any]: ...

    def load_sampler_state(self, state: Mapping[str, Any]) -> None: ...


@runtime_checkable
class WeightPublisher(Protocol):
    """Ships a new policy version to the fleet. ``version`` strictly increases per run.

    ``weights`` is a flat name -> tensor mapping (torch tensors or numpy arrays), never
    pickled: comms ships it as raw tensors with a manifest and checksums. ``latest_version``
    is the newest version published (0 before any), so a restarted learner never reuses one.

    Raises (``publish``): ValueError when ``version`` is not above ``latest_version()``.
    """

    def latest_version(self) -> int: ...

    def publish(self, version: int, weights: Mapping[str, Any]) -> None: ...
