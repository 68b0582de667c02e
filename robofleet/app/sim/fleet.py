"""The simulated fleet: Meta-World robots that enroll, report and run edge agents like real ones.

* :func:`enroll_sim_robots` walks each new robot through the real enrollment path: a one-time
  token from the metadata store, exchanged over the cloud's gRPC Enrollment service for a
  credential, stored in the robot's spool directory exactly where ``robofleet edge`` keeps it.
* :class:`SimFleetHost` is the robots' "computer": while no edge agent runs on a robot it
  sends the robot's heartbeat over gRPC (an idle real robot's agent does the same), so idle
  simulated robots stay schedulable and a silent one is marked offline like any other.
* :class:`SimRobotWorker` is edge_agent's Ray worker with a per-robot episode seed, so robots
  of one fleet do not replay the same goal variations.
* :func:`demonstration_records` runs the scripted expert to produce the handful of
  demonstrations the weak initial policy is cloned from.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import select

from comms.config import CommsSettings
from edge_agent.build import AgentOptions
from edge_agent.config import EdgeSettings
from edge_agent.credential import (
    RobotCredential,
    credential_path,
    read_credential,
    write_credential,
)
from edge_agent.ray_actor import EdgeAgentWorker
from robofleet.store.models import Robot
from robofleet.store.store import MetadataStore

log = logging.getLogger(__name__)

ROBOT_TYPE = "metaworld-sawyer"
# Meta-World's goal-observable state and the Sawyer's action (hal.drivers.metaworld).
STATE_DIM = 39
ACTION_DIM = 4
DEMO_ROBOT = "demo"
SIM_TAG = "simulated"


def spool_dir(data_dir: Path, name: str) -> Path:
    """Where robot ``name`` keeps its spool and credential."""
    return data_dir / "robots" / name


def enroll_sim_robots(
    store: MetadataStore,
    comms: CommsSettings,
    server: str,
    names: Sequence[str],
    data_dir: Path,
    node_ip: str,
) -> list[int]:
    """Enroll the robots of ``names`` that are not enrolled yet; returns every robot's id.

    Raises:
        grpc.RpcError: the cloud refused the enrollment.
    """
    from comms.client import EdgeClient, enroll, make_channel
    from hal.drivers.metaworld import MetaWorldDriver

    ids: list[int] = []
    for name in names:
        directory = spool_dir(data_dir, name)
        cred_path = credential_path(directory)
        with store.session() as s:
            robot = s.scalar(select(Robot).where(Robot.name == name))
        if robot is not None and cred_path.exists():
            ids.append(robot.id)
            continue
        if robot is not None:
            raise RuntimeError(f"robot {name} is enrolled but its credential {cred_path} is gone")
        token = store.create_enrollment_token(
            timedelta(minutes=5), robot_name=name, robot_type=ROBOT_TYPE, actor="simfleet"
        )
        spec = MetaWorldDriver(name).spec.to_dict()
        ch = make_channel(server, comms)
        try:
            robot_id, credential = enroll(ch, token, name, ROBOT_TYPE, spec)
        finally:
            ch.close()
        write_credential(directory, RobotCredential(robot_id, credential))
        with store.session() as s:
            row = s.get(Robot, robot_id)
            assert row is not None
            # Pins the robot's edge agent to this Ray node (hal.scheduler reads node_ip).
            row.tags = {**row.tags, SIM_TAG: "true", "node_ip": node_ip}
        client = EdgeClient(make_channel(server, comms), credential, comms)
        try:
            client.heartbeat("idle", -1, {})  # first report: enrolled -> idle
        finally:
            client.close()
        ids.append(robot_id)
    return ids


class SimFleetHost:
    """Heartbeats idle simulated robots over gRPC; robots in :attr:`busy` beat for themselves.

    ``busy`` maps a robot to the end of its agent's start-up grace (``time.monotonic()``): an
    edge agent process takes seconds to import and connect before its first heartbeat, and the
    robot must not look offline meanwhile. After the grace only the agent speaks for it.
    """

    def __init__(
        self, comms: CommsSettings, server: str, data_dir: Path, interval_s: float
    ) -> None:
        self.comms = comms
        self.server = server
        self.data_dir = data_dir
        self.interval_s = interval_s
        self.busy: dict[str, float] = {}
        self.robots: set[str] = set()
        self._clients: dict[str, Any] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="simfleet-host", daemon=True)

    def start(self) -> SimFleetHost:
        self._thread.start()
        return self

    def _client(self, name: str) -> Any:
        from comms.client import EdgeClient, make_channel

        c = self._clients.get(name)
        if c is None:
            directory = spool_dir(self.data_dir, name)
            cred = read_credential(directory)
            if cred is None:
                raise FileNotFoundError(f"{credential_path(directory)}: robot {name} not enrolled")
            c = EdgeClient(make_channel(self.server, self.comms), cred.credential, self.comms)
            self._clients[name] = c
        return c

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            now = time.monotonic()
            quiet = {n for n, grace_end in self.busy.items() if grace_end <= now}
            for name in sorted(self.robots - quiet):
                try:
                    self._client(name).heartbeat("idle", -1, {})
                except Exception as exc:  # the next beat tries again
                    log.debug("heartbeat of %s failed: %s", name, exc)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for c in self._clients.values():
            c.close()


class SimRobotWorker(EdgeAgentWorker):
    """``edge_agent.ray_actor.EdgeAgentWorker`` whose driver starts at episode seed ``seed``."""

    def __init__(
        self, edge: dict[str, Any], comms: dict[str, Any], opts: AgentOptions, seed: int
    ) -> None:
        super().__init__(EdgeSettings(**edge), CommsSettings(**comms), replace(opts, seed=seed))

    def drain(self, timeout_s: float) -> bool:
        """Flush the uplink and wait until the cloud acknowledged every spooled step."""
        agent = self._built.agent
        agent.uplink.flush()
        spool = agent.uplink.spool
        return bool(spool.wait_acked(spool.next_seq - 1, timeout_s))


def demonstration_records(
    tasks: Sequence[str], per_task: int, max_steps: int, run_id: str, first_seed: int = 20_000
) -> list[dict[str, Any]]:
    """Scripted-expert episodes as buffer step records (``is_intervention`` True, robot
    ``demo``), ``per_task`` per task, each ``max_steps`` long, seeds from ``first_seed``."""
    from hal.drivers.metaworld import MetaWorldDriver, expert_policy

    driver = MetaWorldDriver(DEMO_ROBOT, tasks=list(tasks), max_episode_steps=max_steps)
    records: list[dict[str, Any]] = []
    seq = 0
    driver.connect()  # hal's driver builds Meta-World's task lists under its own lock
    try:
        for t_i, task in enumerate(tasks):
            expert = expert_policy(task)
            for k in range(per_task):
                episode = t_i * per_task + k
                obs = driver.reset(task=task, seed=first_seed + episode)
                for frame in range(max_steps):
                    action = expert(obs)
                    driver.send_action({"action": action})
                    nxt = driver.get_observation()
                    done = frame == max_steps - 1
                    rec: dict[str, Any] = {
                        "seq": seq,
                        "robot_id": DEMO_ROBOT,
                        "run_id": run_id,
                        "task": task,
                        "episode_index": episode,
                        "frame_index": frame,
                        "timestamp": frame / 20.0,
                        "reward": float(driver.episode.reward),
                        "terminated": False,
                        "truncated": done,
                        "is_intervention": True,
                        "policy_version": 0,
                        "action": np.asarray(action, np.float32),
                        "observation.state": obs["observation.state"],
                    }
                    if done:
                        rec["next.observation.state"] = nxt["observation.state"]
                    records.append(rec)
                    seq += 1
                    obs = nxt
    finally:
        driver.disconnect()
    return records
