"""The remote operator: a person at the dashboard's operator station drives the robot.

The station (``dashboard.api.station``) sends one command per control tick of the page, and
a heartbeat between them, through the cloud onto the robot's Control stream (kind
``teleop``, :meth:`edge_agent.control.CloudControl.handle`). A command is JSON::

    {"id": 17,                    # > 0, increasing per page; older ids are dropped
     "axes": [x, y, z, gripper],  # each in [-1, 1] (fewer entries: the rest 0)
     "deadman": true,             # the page's deadman key (or gamepad button) is held
     "label": ""}                 # "success" / "failure": the person's verdict, ends the episode

While the deadman is held the operator takes the step: the axes (x, y, z scaled by
``step_size``; the gripper as sent, and when a command sends only 3 axes the gripper stays
where the policy last put it, so a takeover never drops what the robot holds) on the robot's
action (``axis_dims``: by name when the action feature names its dims ``x`` / ``y`` /
``z`` / ``gripper``, or ``delta_x``..., else dims 0-3 as the keyboard's), flagged as an
intervention. The takeover ends, and the robot **holds** (a ``pause`` on its
:class:`~edge_agent.control.CloudControl`: the loop sends nothing more until the station or
the cloud resumes it), when the deadman is released or no command arrived for ``timeout_s``
(the page closed, the network went). The step that notices sends the safe hold (zeros on the
moving dims, the gripper kept).

Every ``frame_interval_s`` and at once after each step that acted on a new command, a
:class:`StationUpdate` goes to ``send`` (comms' ``EdgeClient.station_report`` in
``edge_agent.build``): the latest camera frame as JPEG, whether the station drives the robot,
and the id of the last command a step acted on (the page's round-trip echo).

Without a takeover the ``inner`` source decides (default: nobody, the policy acts).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge_agent.control import CloudControl
from edge_agent.core import InterventionSource, Observation, OperatorInput
from edge_agent.operators import NoOperator

log = logging.getLogger(__name__)

AXES = ("x", "y", "z", "gripper")
LABELS = ("", "success", "failure")
SOURCE = "browser"  # OperatorInput.reason of the steps the station drove


@dataclass(frozen=True)
class StationCommand:
    """One parsed station command (see the module doc)."""

    id: int
    axes: tuple[float, ...]
    deadman: bool
    label: str


@dataclass(frozen=True)
class StationUpdate:
    """What the robot shows the station: ``frame`` JPEG bytes (empty: no new frame) of
    ``camera``, ``taken_over``, ``echo_id`` (last command acted on, 0: none), ``note`` (why
    the last takeover ended)."""

    frame: bytes
    camera: str
    taken_over: bool
    echo_id: int
    note: str


def parse_command(text: str) -> StationCommand:
    """Parse a station command.

    Raises:
        ValueError: not a JSON object, ``id`` not a positive int, ``axes`` not a list of at
            most 4 numbers in [-1, 1], ``deadman`` not a bool, or an unknown ``label``.
    """
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"station command is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"station command must be a JSON object, got {type(raw).__name__}")
    ident = raw.get("id")
    if not isinstance(ident, int) or isinstance(ident, bool) or ident <= 0:
        raise ValueError(f"station command id must be a positive int, got {ident!r}")
    axes = raw.get("axes", [])
    if (
        not isinstance(axes, list)
        or len(axes) > len(AXES)
        or not all(isinstance(a, int | float) and not isinstance(a, bool) for a in axes)
        or not all(-1.0 <= float(a) <= 1.0 for a in axes)
    ):
        raise ValueError(f"station command axes must be up to 4 numbers in [-1, 1], got {axes!r}")
    deadman = raw.get("deadman", False)
    if not isinstance(deadman, bool):
        raise ValueError(f"station command deadman must be true or false, got {deadman!r}")
    label = raw.get("label", "")
    if label not in LABELS:
        raise ValueError(f"station command label must be one of {LABELS}, got {label!r}")
    return StationCommand(ident, tuple(float(a) for a in axes), deadman, label)


def axis_dims(action_feature: Mapping[str, Any]) -> list[int | None]:
    """Action dim of each of :data:`AXES` (None: the robot has no such dim).

    By the feature's ``names`` when they name the axes (``x`` or ``delta_x``, ...), else
    positionally (dims 0-3 where the action has them).

    Raises:
        ValueError: the action has fewer than 3 dims (a station drives x, y and z).
    """
    shape = list(action_feature.get("shape") or [])
    dim = int(shape[0]) if len(shape) else 0
    if dim < 3:
        raise ValueError(f"the remote operator needs an action of at least 3 dims, got {dim}")
    names = action_feature.get("names")
    if isinstance(names, list | tuple) and len(names) == dim:
        lowered = [str(n).lower() for n in names]
        by_name: list[int | None] = []
        for axis in AXES:
            hits = [i for i, n in enumerate(lowered) if n in (axis, f"delta_{axis}")]
            by_name.append(hits[0] if hits else None)
        if all(d is not None for d in by_name[:3]):
            return by_name
    return [i if i < dim else None for i in range(len(AXES))]


class RemoteOperator:
    """A station person's takeover of this robot (see the module doc).

    Args:
        action_feature: the robot's ``action_features["action"]`` (shape, optional names).
        step_size: action magnitude of a full axis deflection.
        timeout_s: the takeover ends (and the robot holds) when no command came for this long.
        frame_interval_s: seconds between two frames sent to the station.
        inner: the source that decides when nobody at the station drives the robot.
        clock: monotonic seconds (tests pass a fake one).

    Raises:
        ValueError: see :func:`axis_dims`.
    """

    def __init__(
        self,
        action_feature: Mapping[str, Any],
        *,
        step_size: float = 1.0,
        timeout_s: float = 0.5,
        frame_interval_s: float = 0.2,
        inner: InterventionSource | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.dims = axis_dims(action_feature)
        self.action_dim = int(action_feature["shape"][0])
        self.step_size = step_size
        self.timeout_s = timeout_s
        self.frame_interval_s = frame_interval_s
        self.inner: InterventionSource = inner or NoOperator()
        self.clock = clock
        self.control: CloudControl | None = None
        self.send: Callable[[StationUpdate], object] | None = None
        self._lock = threading.Lock()
        self._active = False
        self._axes = np.zeros(len(AXES), np.float32)
        self._last_id = 0
        self._last_seen = 0.0
        self._labels: list[str] = []
        self._applied = 0  # id of the last command a step acted on
        self._gripper = 0.0  # the gripper the robot was last given (policy's, then the person's)
        self._grip_sent = False  # the page sent a gripper value (else the gripper stays put)
        self._hold_next = False  # the step after a takeover ended sends the safe hold
        self.note = ""
        self.takeovers = 0
        self.holds = 0
        self.rejected = 0
        self.steps = 0  # steps this operator took (driven, and the hold after a takeover)
        self._frame: tuple[str, np.ndarray] | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- wiring ----------------------------------------------------------------------------

    def attach(
        self, control: CloudControl, send: Callable[[StationUpdate], object] | None = None
    ) -> None:
        """Take station commands from ``control`` and hold the robot through it; report to
        ``send`` from a background thread (None: nothing is reported)."""
        self.control = control
        control.on_teleop = self.receive
        self.send = send
        if send is not None and self._thread is None:
            self._thread = threading.Thread(target=self._report_loop, name="station", daemon=True)
            self._thread.start()

    # -- commands (the control listener's thread) -------------------------------------------

    def receive(self, text: str) -> None:
        """One station command (JSON); a malformed or stale one is counted and dropped."""
        try:
            cmd = parse_command(text)
        except ValueError as exc:
            self.rejected += 1
            log.warning("dropping station command: %s", exc)
            return
        lost = False
        with self._lock:
            if cmd.id <= self._last_id:
                return  # reordered or repeated: the newest command is what matters
            self._last_id = cmd.id
            self._last_seen = self.clock()
            if cmd.label:
                self._labels.append(cmd.label)
            axes = np.zeros(len(AXES), np.float32)
            axes[: len(cmd.axes)] = cmd.axes
            self._axes = axes
            self._grip_sent = len(cmd.axes) == len(AXES)
            if cmd.deadman and not self._active:
                self._active = True
                self.takeovers += 1
                self.note = ""
            elif not cmd.deadman and self._active:
                lost = True
        if lost:
            self._end("deadman released")

    def check(self) -> None:
        """End a takeover whose commands stopped for ``timeout_s`` (called by each step and
        by the reporting thread, so a robot that holds between steps is covered too)."""
        with self._lock:
            stale = self._active and self.clock() - self._last_seen > self.timeout_s
        if stale:
            self._end("heartbeat lost")

    def _end(self, why: str) -> None:
        with self._lock:
            if not self._active:
                return
            self._active = False
            self._hold_next = True
            self.note = why
            self.holds += 1
        log.warning("station takeover ended (%s): robot holds", why)
        if self.control is not None:
            self.control.handle("pause", f"station: {why}")
        self._wake.set()

    @property
    def taken_over(self) -> bool:
        return self._active

    # -- the control loop ----------------------------------------------------------------------

    def step(self, observation: Observation, proposed: np.ndarray) -> OperatorInput:
        self._keep_frame(observation)
        self.check()
        with self._lock:
            label = self._labels.pop(0) if self._labels else None
            if self._active:
                action = np.zeros(self.action_dim, np.float32)
                for axis, dim in enumerate(self.dims[:3]):
                    if dim is not None:
                        action[dim] = self._axes[axis] * self.step_size
                grip = self.dims[3]
                if grip is not None:  # a position, not a delta: as sent, else as it was
                    if self._grip_sent:
                        self._gripper = float(self._axes[3])
                    action[grip] = self._gripper
                fresh = self._last_id != self._applied
                self._applied = self._last_id
                self.steps += 1
                op = OperatorInput(True, action, label, SOURCE)
            elif self._hold_next:
                self._hold_next = False
                action = np.zeros(self.action_dim, np.float32)
                if self.dims[3] is not None:
                    action[self.dims[3]] = self._gripper  # keep what the gripper holds
                self.steps += 1
                return OperatorInput(True, action, label, "hold")
            else:
                op = None
                if self.dims[3] is not None and len(proposed) > self.dims[3]:
                    self._gripper = float(proposed[self.dims[3]])  # what the robot is given
        if op is not None:
            if fresh:
                self._wake.set()  # the echo goes out now, not at the next frame
            return op
        inner = self.inner.step(observation, proposed)
        if label is not None and inner.command is None:
            inner.command = label
        return inner

    def report(self) -> dict[str, float]:
        """Heartbeat statistics: ``station/steps`` (the steps the station person took, the
        interventions whose source is the browser), ``station/takeovers``, ``station/holds``
        (takeovers that ended in a hold), ``station/rejected`` (malformed commands)."""
        return {
            "station/steps": float(self.steps),
            "station/takeovers": float(self.takeovers),
            "station/holds": float(self.holds),
            "station/rejected": float(self.rejected),
        }

    def reset(self) -> None:
        self.inner.reset()  # a takeover outlives the episode: the person still holds the key

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self.control is not None and self.control.on_teleop == self.receive:
            self.control.on_teleop = None
        self.inner.close()

    # -- reporting (its own thread) -------------------------------------------------------------

    def _keep_frame(self, observation: Observation) -> None:
        cams = sorted(k for k in observation if k.startswith("observation.images."))
        if cams:
            self._frame = (cams[0].removeprefix("observation.images."), observation[cams[0]])

    def update(self, with_frame: bool) -> StationUpdate:
        """What the station is shown now (``with_frame``: the latest frame, JPEG)."""
        frame, camera = b"", ""
        kept = self._frame
        if with_frame and kept is not None:
            camera, frame = kept[0], encode_jpeg(kept[1])
        with self._lock:
            return StationUpdate(frame, camera, self._active, self._applied, self.note)

    def _report_loop(self) -> None:
        next_frame = 0.0
        while not self._stop.is_set():
            self._wake.wait(min(self.frame_interval_s, self.timeout_s / 2))
            self._wake.clear()
            if self._stop.is_set():
                return
            self.check()
            now = time.monotonic()
            with_frame = now >= next_frame
            if with_frame:
                next_frame = now + self.frame_interval_s
            try:
                if self.send is not None:
                    self.send(self.update(with_frame))
            except Exception as exc:  # the cloud away: the station shows the last frame
                log.debug("station report failed: %s", exc)


def encode_jpeg(image: np.ndarray, quality: int = 80) -> bytes:
    """``(H, W, 3|1) uint8`` (or ``(H, W)``) as JPEG bytes.

    Raises:
        ValueError: not a uint8 image of that shape.
    """
    import io

    from PIL import Image

    arr = np.asarray(image)
    if arr.dtype != np.uint8 or arr.ndim not in (2, 3):
        raise ValueError(f"a camera frame must be (H, W[, C]) uint8, got {arr.shape} {arr.dtype}")
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[:, :, 0]
    if arr.ndim == 3 and arr.shape[2] == 4:
        arr = arr[:, :, :3]
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(arr)).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


__all__: Sequence[str] = ("RemoteOperator", "StationCommand", "StationUpdate", "parse_command")
