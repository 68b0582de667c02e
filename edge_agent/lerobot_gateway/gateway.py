"""The gateway process: an enrolled robot toward the cloud, LeRobot's learner toward its actor.

::

    credential (stored, or --token once) -> EdgeClient, Control stream, heartbeats
    gRPC LearnerService on the operator's address (127.0.0.1:PORT by default)
    ASSIGN(run) -> RunLink: spool + uplink + uploader + weight subscription; Ready() answers
                   once the run's first version is converted
    RELEASE / another run's ASSIGN -> drain the run's spool (up to drain_s), back to idle
    ASSIGN of a run whose reward source the gateway cannot apply (``labels``) -> refused, named
    in the heartbeat (state ``refused``, ``info.refused``), as an edge agent refuses a run

Assignments are taken on the gateway's own thread (a drain may take seconds), never on the
Control listener's. Pause and e-stop cannot reach LeRobot's actor (its protocol has no such
message): they are logged and reported in the heartbeat's ``info``.
"""

from __future__ import annotations

import logging
import threading
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from lerobot.transport import services_pb2_grpc

from comms.proto import robofleet_pb2 as pb
from edge_agent.assignment import Assignment, AssignmentError
from edge_agent.build import AgentOptions, credential
from edge_agent.config import EdgeSettings
from edge_agent.lerobot_gateway.features import ActorConfig
from edge_agent.lerobot_gateway.parameters import DEFAULT, ParametersFn
from edge_agent.lerobot_gateway.rewards import GatewayReward, RewardSourceRefused
from edge_agent.lerobot_gateway.run import RunLink, describe
from edge_agent.lerobot_gateway.service import GatewayService
from edge_agent.lerobot_gateway.state import GatewayState

log = logging.getLogger(__name__)

# Room for LeRobot's 2 MB chunks with their envelope (its own learner allows 4 MB).
GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 8 * 1024**2),
    ("grpc.max_send_message_length", 8 * 1024**2),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
]


@dataclass
class GatewayOptions:
    """One gateway's options.

    Attributes:
        robot_name: the robot's name in the fleet. server: the cloud's gRPC ``host:port``.
        token: one-time enrollment token (first start only). root: the spool root (the
            credential and one spool per run live there).
        actor: the actor's features, port and fps (``features.read_actor_config``).
        listen: where the actor connects (default ``127.0.0.1:<actor.port>``).
        parameters: version -> LeRobot's parameter bytes.
        drain_s: seconds a release waits for the cloud to acknowledge the run's spool.
        poll_s: how often waiting calls check that their actor is still there.
    """

    robot_name: str
    server: str
    root: Path
    actor: ActorConfig
    token: str | None = None
    listen: str | None = None
    parameters: ParametersFn = field(default=DEFAULT)
    drain_s: float = 30.0
    poll_s: float = 0.5


class LeRobotGateway:
    """Serves one LeRobot actor and one robot's place in the fleet (see the module)."""

    def __init__(self, edge: EdgeSettings, comms: Any, opts: GatewayOptions) -> None:
        self.edge = edge
        self.comms = comms
        self.opts = opts
        self.state = GatewayState()
        self.schema = opts.actor.schema()
        self.robot_id = -1
        self.port = 0
        self._client: Any = None
        self._listener: Any = None
        self._server: grpc.Server | None = None
        self._link: RunLink | None = None
        self._pending: Assignment | None = None
        self._release: str | None = None
        self._held: str = ""  # a pause / e-stop the actor cannot obey (reported)
        self._refused: tuple[str, str] | None = None  # (run id, reason) of a refused run
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> int:
        """Enroll (or read the credential), open the cloud links and serve the actor;
        returns the port the actor connects to.

        Raises:
            ValueError: no credential stored and no token.
            edge_agent.enrollment.EnrollmentRefused: the cloud refused the token or name.
            RuntimeError: the listen address cannot be bound.
        """
        from comms.robot.client import ControlListener, EdgeClient, make_channel

        o = self.opts
        o.root.mkdir(parents=True, exist_ok=True)
        base = AgentOptions(o.robot_name, [], "lerobot-gateway", server=o.server, token=o.token)
        self.robot_id, secret = credential(
            o.root, base, self.comms, o.actor.spec.to_dict(), self._stop
        )
        self._client = EdgeClient(
            make_channel(o.server, self.comms), secret, self.comms, address=o.server
        )
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=32, thread_name_prefix="lerobot-gw"),
            options=GRPC_OPTIONS,
        )
        services_pb2_grpc.add_LearnerServiceServicer_to_server(
            GatewayService(self.state, o.poll_s), server
        )
        listen = o.listen or f"127.0.0.1:{o.actor.port}"
        port = server.add_insecure_port(listen)
        if port == 0:
            raise RuntimeError(f"cannot listen on {listen} for the LeRobot actor")
        server.start()
        self._server, self.port = server, port
        self._listener = ControlListener(self._client, self._on_command)
        log.info(
            "lerobot-gateway: robot %s (id %d), actor's LearnerService on %s",
            o.robot_name,
            self.robot_id,
            listen.rsplit(":", 1)[0] + f":{port}",
        )
        return port

    def run(self) -> None:
        """Serve until :meth:`stop`: take assignments, beat, then close everything."""
        try:
            while not self._stop.is_set():
                self._take()
                self.beat()
                self._wake.wait(self.edge.heartbeat_interval_s)
                self._wake.clear()
        finally:
            self.close()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def close(self) -> None:
        """Stop serving the actor, drain and close the run, close the cloud links."""
        self.state.stop()
        if self._server is not None:
            self._server.stop(grace=1.0).wait(5)
        self._leave()
        if self._listener is not None:
            self._listener.close()
        self.beat()
        if self._client is not None:
            self._client.close()

    # -- cloud side ----------------------------------------------------------------------

    def beat(self) -> None:
        """One heartbeat: state, the version last handed to the actor, counters, metrics."""
        if self._client is None:
            return
        stats, refusals = self.state.snapshot()
        with self._lock:
            link, held, refused = self._link, self._held, self._refused
        stats.update(describe(link))
        info: dict[str, Any] = {"robot": {"spec": self.opts.actor.spec.to_dict()}}
        if refusals:
            info["refusals"] = refusals
        if held:
            info["held"] = held
        state, run_id = ("idle", "") if link is None else ("running", link.run_id)
        if link is None and refused is not None:
            state, run_id = "refused", refused[0]
            info["refused"] = refused[1]
        version = self.state.handed_version
        try:
            self._client.heartbeat(
                state, None if version < 0 else version, stats, run_id=run_id, info=info
            )
        except Exception as exc:  # a cloud outage must not stop the gateway
            log.info("heartbeat failed: %s", exc)

    def _on_command(self, cmd: pb.ControlCommand) -> None:
        try:
            kind = pb.ControlCommand.Kind.Name(cmd.kind).lower()
        except ValueError:
            kind = f"kind_{cmd.kind}"
        with self._lock:
            if kind == "assign":
                try:
                    self._pending = Assignment.from_json(cmd.assignment)
                except AssignmentError as exc:
                    log.error("refusing an assignment: %s", exc)
            elif kind == "release":
                self._release = cmd.run_id
            elif kind in ("pause", "estop"):
                self._held = kind
                log.warning("%s from the cloud: LeRobot's actor has no such message", kind)
            elif kind in ("resume", "clear_estop"):
                self._held = ""
        self._wake.set()

    def _take(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, None
            release, self._release = self._release, None
            current = self._link
        if current is not None and (
            (release is not None and release == current.run_id)
            or (pending is not None and pending.run_id != current.run_id)
        ):
            self._leave()
            current = None
        if pending is not None and current is None:
            self._join(pending)

    def _join(self, a: Assignment) -> None:
        task = a.tasks[0] if a.tasks else "lerobot"
        try:
            reward = GatewayReward(a.reward_source)
            link = self._open(a, task, reward)
        except (RewardSourceRefused, ValueError) as exc:  # a reward or an ingest route
            log.error("refusing run %s: %s", a.run_id, exc)
            with self._lock:
                self._refused = (a.run_id, str(exc))
            self.beat()
            return
        with self._lock:
            self._link, self._refused = link, None
        self.state.set_run(link)
        log.info("assigned to run %s (reward: %s)", a.run_id, reward.name)

    def _open(self, a: Assignment, task: str, reward: GatewayReward) -> RunLink:
        o = self.opts
        return RunLink(
            a.run_id,
            task,
            o.root,
            self.robot_id,
            self._client,
            self.edge,
            self.schema,
            o.actor.fps,
            o.parameters,
            self.state.set_parameters,
            self._parameter_error,
            reward,
            a.ingest,
        )

    def _leave(self) -> None:
        with self._lock:
            link, self._link = self._link, None
        if link is None:
            return
        self.state.set_run(None)
        link.close(self.opts.drain_s)
        log.info("left run %s", link.run_id)

    def _parameter_error(self) -> None:
        with self.state.cond:
            self.state.counters.parameter_errors += 1
