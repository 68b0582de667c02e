"""A robot computer's edge service: enrolled once, idle until the cloud assigns it to a run.

``robofleet edge`` without ``--run`` runs :class:`RobotComputer` (by hand, as a systemd unit or
in a container)::

    enroll (first start: one-time token -> credential, kept in the spool directory)
      -> idle: heartbeats ("idle", the robot's description), Control stream held open
      -> ASSIGN(run, Assignment): build the run's edge agent (driver, policy from the
         version's card, weight subscription, uplink to the run), run episodes
      -> RELEASE / the run's end / another run's ASSIGN: finish the episode at a safe
         boundary, drain the run's spool, back to idle: ready for the next run, no restart

Pause, resume and e-stop go to the running agent's :class:`edge_agent.control.CloudControl`;
an e-stop while idle latches here and the robot takes no assignment until it is cleared.
Each run gets its own spool (``<spool>/runs/<run_id>``), so a robot computer that restarts
mid-run and is assigned again continues that run's episode numbering and uploads what it
had not sent. The cloud re-sends the assignment of a leased robot that reports idle, so a
restart needs nothing from the robot but to come back.
"""

from __future__ import annotations

import importlib
import logging
import threading
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from comms.proto import robofleet_pb2 as pb
from edge_agent.assignment import Assignment, AssignmentError
from edge_agent.build import AgentOptions, BuiltAgent, build_agent, credential, probe_driver
from edge_agent.config import EdgeSettings
from edge_agent.episodes import EpisodeLog

if TYPE_CHECKING:
    from comms.robot.client import EdgeClient

log = logging.getLogger(__name__)


# What every run's agent imports when it is built (a policy runner, the uplink, the weight
# subscription): imported while the robot computer is idle, not after the assignment. torch
# alone is ~1.1 s of CPU, pyarrow's pandas shim ~1 s; 16 computers on 2 cores paid that at
# every launch (``robofleet bench assign``). LeRobot's policies are left to the runs that use
# them (~4.5 s and a few hundred MB more for a robot that may never run one).
PREWARM_MODULES = (
    "torch",
    "edge_agent.policy_build",
    "edge_agent.control",
    "comms.robot.uploader",
    "comms.robot.grpc_subscription",
    "comms.robot.receiver",
    "comms.robot.mark_sender",
    "buffer.table.schema",
)


def prewarm() -> None:
    """Import :data:`PREWARM_MODULES` and pay pyarrow's first list conversion (it imports
    pandas). A module that fails to import is left to the run that needs it (logged)."""
    for name in PREWARM_MODULES:
        try:
            importlib.import_module(name)
        except Exception as exc:  # the run's build reports it, with its context
            log.info("could not pre-import %s: %s", name, exc)
    import pyarrow as pa

    pa.array([0], type=pa.int64())


def run_spool(root: Path, run_id: str) -> Path:
    """The spool directory of run ``run_id`` on a robot computer whose spool root is ``root``."""
    return root / "runs" / run_id


class RobotComputer:
    """The edge service of one robot: idle, assigned, released, idle again.

    Args:
        edge / comms: the robot computer's own settings.
        base: the robot's options (name, driver, operator, server, token, spool root in
            ``spool_dir``); the run's fields come from each assignment.
        drain_s: seconds to wait at release for the cloud to acknowledge the run's spool.
    """

    def __init__(
        self, edge: EdgeSettings, comms: Any, base: AgentOptions, drain_s: float = 30.0
    ) -> None:
        if base.server is None:
            raise ValueError("a robot computer needs --server (the cloud assigns it runs)")
        self.edge = edge
        self.comms = comms
        self.base = base
        self.root = base.spool_dir or edge.spool_dir / base.robot_name
        self.drain_s = drain_s
        self.runs_served = 0
        self.client: EdgeClient | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._pending: Assignment | None = None
        self._current: tuple[str, BuiltAgent] | None = None
        self._estopped = False
        self._last_run = ""  # the run the idle heartbeat's stats belong to
        self._last_report: dict[str, float] = {}
        self._refused: tuple[str, str] | None = None  # (run id, reason)
        self._description: dict[str, Any] = {}
        self._prewarm: threading.Thread | None = None

    # -- public ----------------------------------------------------------------------------

    @property
    def current_run(self) -> str | None:
        """The run the robot acts in now (None while idle)."""
        with self._lock:
            return None if self._current is None else self._current[0]

    def stop(self) -> None:
        """Leave the current run at a safe boundary (its spool drained) and return from run."""
        self._stop.set()
        with self._lock:
            current = self._current
        if current is not None:
            current[1].agent.stop()
        self._wake.set()

    def run(self, max_runs: int | None = None) -> dict[str, float]:
        """Serve assignments until :meth:`stop` (or ``max_runs`` runs); returns the last
        run's report.

        Raises:
            ValueError: no stored credential and no token, or a bad driver option.
            edge_agent.enrollment.EnrollmentRefused: the cloud refused the token or the name.
        """
        from comms.robot.client import ControlListener, EdgeClient, make_channel
        from edge_agent.enrollment import EnrollmentStopped

        driver = self._probe()
        spec = driver.spec.to_dict()
        self._description = {
            "spec": spec,
            "driver": self.base.driver,
            "operator": self.base.operator,
        }
        self.root.mkdir(parents=True, exist_ok=True)
        assert self.base.server is not None
        try:
            robot_id, secret = credential(self.root, self.base, self.comms, spec, self._stop)
        except EnrollmentStopped:
            return {}
        self.client = EdgeClient(
            make_channel(self.base.server, self.comms), secret, self.comms, address=self.base.server
        )
        listener = ControlListener(self.client, self._on_command)
        log.info("robot %s (id %d) is idle, waiting for a run", self.base.robot_name, robot_id)
        # Imports run on one thread at a time here: an assignment waits for this thread
        # before it builds (two threads importing one package graph can deadlock).
        self._prewarm = threading.Thread(target=prewarm, name="edge-prewarm", daemon=True)
        self._prewarm.start()
        try:
            while not self._stop.is_set():
                assignment = self._take()
                if assignment is None:
                    self._beat_idle()
                    self._wake.wait(self.edge.heartbeat_interval_s)
                    self._wake.clear()
                    continue
                self._serve(assignment)
                if max_runs is not None and self.runs_served >= max_runs:
                    break
        finally:
            listener.close()
            self._beat_idle()
            self.client.close()
        return dict(self._last_report)

    def _probe(self) -> Any:
        """The driver the robot describes itself with: with no ``--task``, a driver that lists
        its tasks (``hal.driver.TaskCatalogDriver``) is described with all of them (the run's
        assignment picks some)."""
        from hal.driver import TaskCatalogDriver

        driver = probe_driver(self.base)
        if self.base.tasks or not isinstance(driver, TaskCatalogDriver):
            return driver
        return probe_driver(replace(self.base, tasks=driver.available_tasks()))

    # -- commands from the cloud (the listener's thread) -------------------------------------

    def _on_command(self, cmd: pb.ControlCommand) -> None:
        try:
            kind = pb.ControlCommand.Kind.Name(cmd.kind).lower()
        except ValueError:  # a kind a newer cloud added
            kind = f"kind_{cmd.kind}"
        if kind == "assign":
            self._assign(cmd.assignment)
        elif kind == "release":
            self._release(cmd.run_id, cmd.reason)
        else:
            self._forward(kind, cmd)
        self._wake.set()

    def _assign(self, text: str) -> None:
        try:
            assignment = Assignment.from_json(text)
        except AssignmentError as exc:
            log.error("refusing an assignment: %s", exc)
            self._refused = ("", str(exc))
            return
        with self._lock:
            current = self._current
            if current is not None and current[0] == assignment.run_id:
                return  # already in that run (a re-sent assignment)
            self._pending = assignment
        if current is not None:  # another run wants the robot: leave this one first
            log.info("leaving run %s for run %s", current[0], assignment.run_id)
            current[1].agent.stop()

    def _release(self, run_id: str, reason: str) -> None:
        with self._lock:
            if self._pending is not None and self._pending.run_id == run_id:
                self._pending = None
            current = self._current
        if current is not None and current[0] == run_id:
            log.info("released from run %s (%s)", run_id, reason or "no reason")
            current[1].agent.stop()

    def _forward(self, kind: str, cmd: pb.ControlCommand) -> None:
        """Pause, resume, e-stop, clear, station commands: the running agent's, or the idle
        robot's latch."""
        with self._lock:
            current = self._current
            if current is None:
                if kind == "estop":
                    self._estopped = True
                    log.warning("e-stop while idle (%s): no run is taken until cleared", cmd.reason)
                elif kind == "clear_estop":
                    self._estopped = False
                return
        current[1].agent.control.handle(kind, cmd.reason, int(cmd.seq), cmd.run_id, cmd.teleop)

    # -- the loop ----------------------------------------------------------------------------

    def _take(self) -> Assignment | None:
        with self._lock:
            if self._estopped:
                return None
            assignment, self._pending = self._pending, None
            return assignment

    def _beat_idle(self) -> None:
        if self.client is None:
            return
        info: dict[str, Any] = {"robot": self._description}
        if self._refused is not None:
            info["refused"] = self._refused[1]
        run_id = self._refused[0] if self._refused is not None else self._last_run
        state = "estopped" if self._estopped else ("refused" if self._refused else "idle")
        try:
            self.client.heartbeat(state, None, self._last_report, run_id=run_id, info=info)
        except Exception as exc:  # a cloud outage must not stop the robot computer
            log.info("idle heartbeat failed: %s", exc)

    def _beat_starting(self, run_id: str, started: threading.Event) -> None:
        """Heartbeats while the run's agent is built and its robot connects (until it runs)."""
        while not started.wait(self.edge.heartbeat_interval_s):
            with self._lock:
                current = self._current
            if self.client is None or (current is not None and current[1].agent.state != "idle"):
                return  # the agent's own heartbeats took over
            try:
                self.client.heartbeat("starting", None, {}, run_id=run_id)
            except Exception as exc:
                log.info("heartbeat failed: %s", exc)

    def _options(self, a: Assignment, spool: Path) -> AgentOptions:
        return replace(
            self.base,
            run_id=a.run_id,
            tasks=list(a.tasks) or list(self.base.tasks),
            max_episode_steps=a.max_episode_steps,
            hidden=a.hidden,
            seed=a.seed + EpisodeLog(spool).next_index,
            terminate_on_success=a.terminate_on_success,
            demonstrations=dict(a.demonstrations),
            reward_source=a.reward_source,
            help=dict(a.help),
            ingest=dict(a.ingest),
            spool_dir=spool,
            credential_dir=self.root,
            token=None,
        )

    def _refuse(self, a: Assignment, why: str) -> None:
        log.error("refusing run %s: %s", a.run_id, why)
        self._refused = (a.run_id, why)
        self._beat_idle()

    def _serve(self, a: Assignment) -> None:
        """Act in run ``a.run_id`` until released, then drain its spool and go idle."""
        self._refused = None
        if a.needs_operator and self.base.operator == "none":
            self._refuse(a, "the run learns from interventions and this robot has no operator")
            return
        if any(a.demonstrations.values()) and self.base.operator == "none":
            self._refuse(a, "the run asks for demonstrations and this robot has no operator")
            return
        spool = run_spool(self.root, a.run_id)
        spool.mkdir(parents=True, exist_ok=True)
        # Building the agent and connecting the robot take seconds (a simulator builds its
        # scenes, a policy imports torch): beat "starting" meanwhile, so it is not offline.
        started = threading.Event()
        beats = threading.Thread(
            target=self._beat_starting, args=(a.run_id, started), name="edge-starting", daemon=True
        )
        beats.start()
        try:
            try:
                if self._prewarm is not None:
                    self._prewarm.join()
                edge = a.edge_settings(self.edge).model_copy(update={"cloud_control": False})
                built = build_agent(edge, self.comms, self._options(a, spool))
            except (ValueError, OSError) as exc:  # AssignmentError is a ValueError
                self._refuse(a, str(exc))
                return
            with self._lock:
                self._current = (a.run_id, built)
            log.info("assigned to run %s", a.run_id)
        finally:
            if self._current is None:
                started.set()
        try:
            built.agent.run()
        except Exception:
            # A failed robot (driver fault) ends this stint; the cloud assigns it again.
            log.exception("robot %s failed in run %s", self.base.robot_name, a.run_id)
        finally:
            started.set()
            report = self._drain(built)
            with self._lock:
                self._current = None
            built.close()
        self._last_run, self._last_report = a.run_id, report
        self.runs_served += 1
        self._beat_idle()  # at once: the cloud sees the robot released with its final report

    def _drain(self, built: BuiltAgent) -> dict[str, float]:
        """Hand the run's spool to the cloud (up to ``drain_s``); the agent's final report."""
        uplink = built.agent.uplink
        uplink.flush()
        spool = uplink.spool
        drained = bool(spool.wait_acked(spool.next_seq - 1, self.drain_s))
        if not drained:
            log.warning(
                "run %s: %d spooled step(s) not acknowledged after %.0fs; they stay in %s "
                "and are sent when the robot is assigned to the run again",
                built.agent.run_id,
                spool.next_seq - 1 - spool.acked_seq,
                self.drain_s,
                spool.directory,
            )
        return {**built.agent.report(), "drained": float(drained)}
