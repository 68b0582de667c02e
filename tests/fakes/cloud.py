"""The suite's one cloud harness, at three levels:

* :class:`Cloud`: comms' ``CloudServer`` on loopback in the test's own process, in front of a
  step sink (a ``MemorySink``, a ``ReplayBufferSink`` on a real replay buffer, a per-run resolver);
  it enrolls robots (:meth:`Cloud.robot`) and opens their clients (:meth:`Cloud.client`).
  :class:`RobotComputer` is a robot computer as such a cloud sees one (heartbeats, Control).
* :class:`CloudProcess`: the same cloud with a ``ReplayBufferSink`` in a child process
  (``python -m tests.fakes.cloud DB_URL BUFFER_DIR PORT``), for tests that SIGKILL the cloud.
* :class:`RobofleetCloud`: a real ``robofleet cloud`` process tree (Ray, edge agents, learners)
  for system tests, with :func:`cli` for the ``robofleet`` commands beside it.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from buffer.table.schema import StepSchema
from comms.cloud.server import CloudServer
from comms.cloud.services.common import ActHandler
from comms.cloud.shard_routes import RouteResolver
from comms.cloud.step_sink import MemorySink, SinkResolver, StepSink
from comms.config import CommsSettings
from comms.proto import robofleet_pb2 as pb
from comms.robot.client import ControlListener, EdgeClient, enroll, make_channel
from foundation.store.metadata_store import MetadataStore, upgrade
from foundation.store.models import Run
from tests.fakes.procs import Child, python_module, wait_until
from tests.fakes.settings import cloud_env, fast_comms

RUN = "run-1"
ROBOFLEET = python_module("robofleet.cli")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def migrated_store(url: str, *run_ids: str, algorithm: str = "hg_dagger") -> MetadataStore:
    """The metadata store at ``url``, migrated, with a run row for each of ``run_ids``."""
    upgrade(url)
    store = MetadataStore(url)
    with store.session() as s:
        for run_id in run_ids:
            s.add(Run(id=run_id, algorithm=algorithm))
    return store


@dataclass
class Robot:
    """An enrolled robot: its id in the store and its credential."""

    robot_id: int
    credential: str


def enroll_robot(
    store: MetadataStore,
    address: str,
    name: str,
    settings: CommsSettings,
    lease: str | None = RUN,
    ca: Path | None = None,
    robot_type: str = "sim_arm",
) -> Robot:
    """Enroll ``name`` over gRPC with a fresh token, then lease it to run ``lease`` (if any)."""
    token = store.create_enrollment_token(timedelta(minutes=5))
    ch = make_channel(address, settings, ca)
    try:
        rid, cred = enroll(ch, token, name, robot_type)
    finally:
        ch.close()
    if lease is not None:
        store.lease_robots(lease, [rid])
    return Robot(rid, cred)


class Cloud[SinkT: StepSink | SinkResolver]:
    """comms' cloud server on loopback in this process (started on construction).

    Args:
        store: the metadata store (enrollment, credentials, leases).
        sink: where uploaded steps go (default: a new ``MemorySink``).
        settings: transport settings (default: ``fast_comms()``).
        act_handler: the remote-inference policy, if the cloud serves ``Act``.
        port: the gRPC port (default: any free one; a restart keeps it).
        routes: a sharded run's ingest routes by run id (``Ingest.Route``).
    """

    def __init__(
        self,
        store: MetadataStore,
        sink: SinkT | None = None,
        settings: CommsSettings | None = None,
        *,
        act_handler: ActHandler | None = None,
        port: int | None = None,
        routes: RouteResolver | None = None,
    ) -> None:
        self.store = store
        self._routes = routes
        self.sink: SinkT = sink if sink is not None else MemorySink()  # type: ignore[assignment]
        self.settings = settings or fast_comms()
        self._act_handler = act_handler
        self.port = port
        self.server = self.start()

    def start(self) -> CloudServer:
        """Serve (again, after :meth:`stop`: same port, same sink, like a restarted cloud)."""
        self.server = CloudServer(
            self.settings,
            self.store,
            self.sink,
            act_handler=self._act_handler,
            port=self.port,
            routes=self._routes,
        )
        self.port = self.server.start()
        return self.server

    def stop(self) -> None:
        """Stop serving (the sink and the store stay, like a buffer on disk)."""
        self.server.stop()

    def close(self) -> None:
        self.server.close()

    def __enter__(self) -> Cloud[SinkT]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def address(self) -> str:
        return self.server.address

    def robot(
        self,
        name: str,
        lease: str | None = RUN,
        ca: Path | None = None,
        robot_type: str = "sim_arm",
    ) -> Robot:
        """Enroll a robot (leased to ``lease`` unless None)."""
        return enroll_robot(self.store, self.address, name, self.settings, lease, ca, robot_type)

    def client(self, robot: Robot, ca: Path | None = None) -> EdgeClient:
        """A robot's client of this cloud (the caller closes it)."""
        channel = make_channel(self.address, self.settings, ca)
        return EdgeClient(channel, robot.credential, self.settings, address=self.address)


PAUSE_RESUME = {"pause": "paused", "resume": "running"}
ESTOP_CLEAR = {"estop": "estopped", "clear_estop": "running"}


class RobotComputer:
    """A robot computer as the cloud sees one: enrolled over gRPC (not leased), it heartbeats
    ``running`` and follows the cloud's Control commands.

    Args:
        cloud: the cloud it enrolls with and listens to.
        name: the robot's name.
        follows: command kind -> the state the robot reports (heartbeats) after obeying it,
            e.g. :data:`PAUSE_RESUME`; other kinds are only recorded.
        lose: command kind -> how many of the first such commands are lost on the way (a
            robot that reconnects, an agent restarted unpaused).

    Attributes:
        robot_id, client, listener: its id, its client, its Control stream.
        state: what the cloud last heard from it (set once the heartbeat returned).
        received: every command kind it received, in order.
    """

    def __init__(
        self,
        cloud: Cloud[Any],
        name: str,
        follows: Mapping[str, str],
        lose: Mapping[str, int] | None = None,
    ) -> None:
        robot = cloud.robot(name, lease=None, robot_type="metaworld-sawyer")
        self.robot_id = robot.robot_id
        self.client = cloud.client(robot)
        self.follows = dict(follows)
        self.lose = dict(lose or {})
        self.received: list[str] = []
        self.state = "running"
        self.client.heartbeat(self.state, None, {})
        self.listener = ControlListener(self.client, self._on)

    def _on(self, cmd: pb.ControlCommand) -> None:
        kind = pb.ControlCommand.Kind.Name(cmd.kind).lower()
        self.received.append(kind)
        if self.received.count(kind) <= self.lose.get(kind, 0):
            return  # lost on the way
        state = self.follows.get(kind)
        if state is not None:
            self.client.heartbeat(state, None, {})  # as the agent does on a change
            self.state = state

    def close(self) -> None:
        self.listener.close()
        self.client.close()


# -- the in-process cloud in a child process ---------------------------------------------------


def metaworld_schema() -> StepSchema:
    """The step schema of a Meta-World Sawyer (what an edge agent on one uploads)."""
    from hal.drivers.metaworld import MetaWorldDriver

    d = MetaWorldDriver("schema-probe", task="reach-v3")
    return StepSchema.from_features(d.observation_features, d.action_features)


class CloudProcess:
    """:class:`Cloud` with a ``ReplayBufferSink`` on the replay buffer at ``buffer_dir`` (schema
    :func:`metaworld_schema`) in a child process on ``port``; started on construction."""

    def __init__(self, db_url: str, buffer_dir: Path, port: int) -> None:
        self.child = Child(python_module("tests.fakes.cloud", db_url, str(buffer_dir), str(port)))
        line = self.child.line(120)
        assert line == "ready", f"cloud process did not start (got {line!r})"

    def kill(self) -> None:
        """SIGKILL it (a crash: nothing is flushed or closed)."""
        self.child.kill()


def main(argv: list[str]) -> int:
    """Serve as :class:`CloudProcess` describes; prints ``ready``, then serves until killed."""
    from buffer.table.replay_buffer import ReplayBuffer
    from comms.cloud.replay_buffer_sink import ReplayBufferSink

    db_url, buffer_dir, port = argv[0], argv[1], int(argv[2])
    buf = ReplayBuffer.open(buffer_dir, metaworld_schema())
    cloud = Cloud(MetadataStore(db_url), ReplayBufferSink(buf), port=port)
    print("ready", flush=True)
    while cloud.server is not None:  # holds the server until killed
        time.sleep(3600)
    return 0


# -- a real robofleet cloud ---------------------------------------------------------------------


class RobofleetCloud:
    """``robofleet cloud --sim-robots N`` on ``data_dir`` in its own session, ready on return.

    ``cameras`` (comma-separated) makes the simulated robots render those cameras at
    ``image_size`` pixels square. ``sections`` become its settings (``orchestration={"learner_hang_s": 30}``) on top of
    :func:`tests.fakes.settings.cloud_env`; ``netns`` runs it in that network namespace
    (``ip netns exec``, :mod:`tests.netns`).
    """

    def __init__(
        self,
        data_dir: Path,
        sim_robots: int,
        *,
        dashboard: bool = False,
        netns: str | None = None,
        cameras: str = "",
        image_size: int = 32,
        **sections: dict[str, Any],
    ) -> None:
        self.data_dir = data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        prefix = ["ip", "netns", "exec", netns] if netns else []
        argv = [*prefix, *ROBOFLEET, "cloud", "--sim-robots", str(sim_robots)]
        if cameras:  # the simulated robots render these Meta-World cameras
            argv += ["--sim-cameras", cameras, "--sim-image-size", str(image_size)]
        argv += ["--port", "0"] if dashboard else ["--no-dashboard"]
        self.child = Child(
            [*argv, "--num-cpus", "4"],
            log=data_dir / f"cloud-{time.time_ns()}.log",
            lines=False,
            env=cloud_env(data_dir, **sections),
        )
        ready = "robofleet cloud: ready"
        wait_until(lambda: ready in self.child.output(10**9), 120, self.fail_text, poll_s=0.5)

    @property
    def grpc_address(self) -> str:
        """The ``host:port`` its gRPC services listen on (from its ready banner)."""
        found = re.search(r"robofleet cloud: gRPC on (\S+)", self.child.output(10**9))
        assert found, f"no gRPC address in its log: {self.fail_text()}"
        return found.group(1)

    def fail_text(self) -> str:
        """The tail of its log, for a failed wait."""
        return self.child.output()

    def kill_tree(self) -> list[int]:
        """SIGKILL the cloud and every descendant (Ray, edge agents, learner); their pids."""
        return self.child.kill()

    def stop(self) -> None:
        """SIGTERM; SIGKILL the tree if it has not ended within two minutes."""
        self.child.stop(120)


def cli(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``robofleet ARGS`` on ``data_dir`` (the environment a :class:`RobofleetCloud` has)."""
    return subprocess.run(
        [*ROBOFLEET, *args], env=cloud_env(data_dir), capture_output=True, text=True, timeout=120
    )


def store_for(data_dir: Path) -> MetadataStore:
    """The metadata store of the cloud on ``data_dir`` (SQLite inside it)."""
    return MetadataStore(f"sqlite:///{(data_dir / 'robofleet.db').as_posix()}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
