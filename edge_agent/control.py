"""Commands the cloud pushes to a robot (e-stop, pause, resume, rerecord, discard) and the
agent's state under them.

:class:`CloudControl` is written by the control listener's thread (comms' ``ControlListener``)
and read by the control loop. The split of work:

* **e-stop** latches the driver *on the listener's thread*, at once (``driver.estop()`` is
  thread-safe and never waits for the loop), then wakes the loop: it stops commanding, closes
  the running episode as truncated and holds until the latch is cleared. A ``resume`` does
  not clear an e-stop; only :meth:`CloudControl.clear_estop` does (a ``clear_estop`` command
  or a human at the robot), because releasing an e-stop is a deliberate decision.
* **pause** is honoured at the next step boundary: the loop sends nothing more and holds in
  the middle of its episode; the uplink keeps draining the spool. **resume** continues the
  same episode.
* **rerecord** / **discard** (from the cloud's API, or :meth:`edge_agent.agent.EdgeAgent.
  rerecord` / ``discard`` at the robot) are the operator's episode commands: the next step
  taken ends its episode and marks it never to be trained on, as the keyboard's and the
  gamepad's do (:meth:`CloudControl.take_command`).
* **help_answered** (a person answered or dismissed a help request in the dashboard; the
  reason is JSON ``{"key", "outcome", "by"}``) ends the robot's waiting request
  (:mod:`edge_agent.help`).
* **teleop** (the dashboard's operator station) carries one command of a person driving the
  robot from a browser; it goes to the remote operator (:mod:`edge_agent.remote`) that
  :attr:`CloudControl.on_teleop` names, counted but not logged line by line (they come at
  the control rate), and is ignored when no remote operator listens.
* **ready** (the dashboard's Ready button) tells a robot that cannot reset itself that its
  operator has set the cell up again (:mod:`edge_agent.resets`); it is taken once by the hold
  between two episodes (:meth:`CloudControl.take_ready`) and means nothing at any other time.

Every command is appended to ``control.jsonl`` in the spool directory (fsynced) and counted
in the agent's heartbeat statistics; the heartbeat's state (``estopped`` / ``paused``) is what
the cloud's registry turns into a ``robot.estopped`` event and status.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from foundation.durable import append_line

log = logging.getLogger(__name__)

KINDS = (
    "estop",
    "pause",
    "resume",
    "clear_estop",
    "lease_changed",
    "noop",
    "rerecord",
    "discard",
    "ready",
    "help_answered",
    "teleop",
)
EPISODE_COMMANDS = ("rerecord", "discard")  # taken by the control loop at its next step


class CloudControl:
    """Thread-safe e-stop latch and pause flag of one robot.

    Args:
        driver: the robot; ``estop()`` is called on e-stop, ``clear_estop()`` (when the
            driver has one, as hal's drivers do) on clear.
        log_path: where each command is appended as one JSON line (None: not logged).
        on_change: called after each state change (e.g. an immediate heartbeat); errors are
            logged, never raised into the listener.
    """

    def __init__(
        self,
        driver: Any,
        log_path: Path | None = None,
        on_change: Callable[[], object] | None = None,
    ) -> None:
        self.driver = driver
        self.log_path = log_path
        self.on_change = on_change
        self._lock = threading.Lock()
        self._estopped = False
        self._paused = False
        self.changed = threading.Event()  # set on every command; the loop waits on it
        self.estop_received_at: float | None = None  # time.monotonic() of the last e-stop
        self.counts: dict[str, int] = {k: 0 for k in KINDS}
        self.unknown = 0
        self._command: tuple[str, str] | None = None  # episode command for the next step
        self._ready = False  # an operator's "ready" (edge_agent.resets) not yet taken
        # Where a person's answer to a help request goes (edge_agent.help.HelpDesk.answered).
        self.on_help: Callable[[str], object] | None = None
        self.on_teleop: Callable[[str], object] | None = None  # the remote operator's inbox

    @property
    def estopped(self) -> bool:
        return self._estopped

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def holding(self) -> bool:
        """The loop must send no action now (e-stopped or paused)."""
        return self._estopped or self._paused

    @property
    def pending(self) -> bool:
        """An episode command (rerecord, discard) waits for the next step."""
        return self._command is not None

    def take_command(self) -> tuple[str, str] | None:
        """The waiting episode command and its reason, once (None when there is none)."""
        with self._lock:
            cmd, self._command = self._command, None
            return cmd

    def take_ready(self) -> bool:
        """Whether a ``ready`` command arrived since the last call (taken once)."""
        with self._lock:
            ready, self._ready = self._ready, False
            return ready

    def handle(
        self, kind: str, reason: str = "", seq: int = 0, run_id: str = "", teleop: str = ""
    ) -> None:
        """Apply one command by name (see :data:`KINDS`); an unknown name is logged and counted.

        ``lease_changed`` and ``noop`` change nothing here (the run's own supervisor
        restarts agents whose lease moved); they are logged for the record. ``rerecord`` and
        ``discard`` wait for the control loop's next step (:meth:`take_command`); ``ready``
        for the reset hold (:meth:`take_ready`); ``teleop`` (its JSON in ``teleop``) for
        :attr:`on_teleop`.
        """
        if kind == "teleop":
            with self._lock:
                self.counts[kind] += 1
            sink = self.on_teleop
            if sink is not None:
                sink(teleop)
            return
        if kind == "estop":
            self.estop(reason)
        elif kind == "pause":
            self._set(paused=True)
        elif kind == "resume":
            self._set(paused=False)
        elif kind == "clear_estop":
            self.clear_estop(reason)
        elif kind in EPISODE_COMMANDS:
            with self._lock:
                self._command = (kind, reason)
        elif kind == "ready":
            with self._lock:
                self._ready = True
            self.changed.set()  # wakes the reset hold at once
        elif kind == "help_answered":
            if self.on_help is not None:
                self.on_help(reason)
            self.changed.set()  # wakes a robot holding for help
        elif kind not in KINDS:
            self.unknown += 1
            log.warning("ignoring unknown control command %r (seq %d)", kind, seq)
            return
        with self._lock:
            self.counts[kind] += 1
        self._record(kind, reason, seq, run_id)
        self._notify()

    def estop(self, reason: str = "") -> None:
        """Latch the driver now (from any thread) and hold the loop until :meth:`clear_estop`."""
        self.driver.estop()  # first: the robot stops before anything else happens
        with self._lock:
            self._estopped = True
            self.estop_received_at = time.monotonic()
        self.changed.set()
        log.warning("e-stop (%s): robot halted, control loop holding", reason or "no reason")

    def clear_estop(self, reason: str = "") -> None:
        """Release the latch on the driver and the loop (a deliberate, human decision)."""
        clear = getattr(self.driver, "clear_estop", None)
        if callable(clear):
            clear()
        self._set(estopped=False)
        log.warning("e-stop cleared (%s)", reason or "no reason")

    def wait(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds, returning early (True) when a command arrives."""
        got = self.changed.wait(timeout)
        self.changed.clear()
        return got

    def report(self) -> dict[str, float]:
        """Counters for heartbeats: commands received per kind, current latch/pause."""
        with self._lock:
            out = {f"control_{k}": float(v) for k, v in self.counts.items() if v}
        out["control_unknown"] = float(self.unknown)
        out["estopped"] = float(self._estopped)
        out["paused"] = float(self._paused)
        return out

    # -- internals ---------------------------------------------------------------------------

    def _set(self, *, estopped: bool | None = None, paused: bool | None = None) -> None:
        with self._lock:
            if estopped is not None:
                self._estopped = estopped
            if paused is not None:
                self._paused = paused
        self.changed.set()

    def _record(self, kind: str, reason: str, seq: int, run_id: str) -> None:
        if self.log_path is None:
            return
        line = {"t": time.time(), "kind": kind, "reason": reason, "seq": seq, "run_id": run_id}
        try:
            append_line(self.log_path, json.dumps(line))
        except OSError as exc:  # a full disk must not stop an e-stop from taking effect
            log.error("could not log control command %s: %s", kind, exc)

    def _notify(self) -> None:
        if self.on_change is None:
            return
        try:
            self.on_change()
        except Exception as exc:
            log.info("control change hook failed: %s", exc)


def listen(client: Any, control: CloudControl) -> Any:
    """Start comms' ``ControlListener`` on ``client`` feeding ``control``; returns it (close it).

    Kinds arrive as protobuf enum values and are passed on by their lower-case name, so a kind
    the cloud adds later (e.g. ``CLEAR_ESTOP``) works as soon as comms' schema has it.
    """
    from comms.proto import robofleet_pb2 as pb
    from comms.robot.client import ControlListener

    def on_command(cmd: Any) -> None:
        try:
            kind = pb.ControlCommand.Kind.Name(cmd.kind).lower()
        except ValueError:
            kind = f"kind_{cmd.kind}"
        control.handle(kind, cmd.reason, int(cmd.seq), cmd.run_id, cmd.teleop)

    return ControlListener(client, on_command)
