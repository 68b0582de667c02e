"""Simulated robot computers: ``robofleet edge`` processes with Meta-World robots.

``robofleet demo`` and ``robofleet cloud --sim-robots N`` start one OS process per simulated
robot running exactly what a lab's robot computer runs (``robofleet edge`` with no run id,
``edge_agent.host``): it enrolls with a one-time token (first start), goes idle, and waits for
the cloud to assign it to a run. The only simulated parts are the driver (Meta-World's Sawyer)
and the operator (its scripted expert). This module plays the robot computer's init system
(systemd's ``Restart=on-failure``): a computer that dies is started again with backoff.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import select

from edge_agent.credential import credential_path
from foundation.store.metadata_store import MetadataStore
from foundation.store.models import Robot
from hal.drivers.metaworld import ROBOT_TYPE
from runs.supervisor import CrashLoop, ProcessSupervisor, RestartPolicy

log = logging.getLogger(__name__)

SIM_TAG = "simulated"


def spool_root(data_dir: Path, name: str) -> Path:
    """Where simulated robot ``name``'s computer keeps its credential and run spools."""
    return data_dir / "robots" / name


def sim_robot_names(n: int) -> list[str]:
    return [f"sim-{i:02d}" for i in range(n)]


def _edge_config(settings: Any, path: Path) -> Path:
    """The robot computers' settings file: the cloud's ``edge`` and ``comms`` sections (the
    simulated computers share the cloud's machine), heartbeats at the fleet's period."""
    edge = settings.edge.model_dump(mode="json")
    edge["heartbeat_interval_s"] = settings.hal.heartbeat_interval_s
    content = {
        "edge": edge,
        "comms": settings.comms.model_dump(mode="json"),
        "log_level": settings.log_level,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(content, sort_keys=True))
    return path


class SimRobotComputers:
    """Start, keep up and stop the simulated robot computers of one cloud.

    Args:
        settings: the cloud's settings (``data_dir``, ``edge``, ``comms``, ``hal``).
        store: metadata store (enrollment tokens).
        server: the cloud's gRPC ``host:port``.
        names: robot names.
        restarts: when to restart a computer that died.
        cameras: Meta-World cameras each robot renders (``corner``, ``topview``, ...;
            empty: state only), at ``image_size`` (height, width).
        driver_options: further ``MetaWorldDriver`` options of every robot (JSON values,
            passed as ``--driver-option``), e.g. ``{"reward": "none", "detects_success":
            False}`` for robots that hide their reward and success.
        tags: enrollment tags beside ``simulated: "true"`` (run specs select robots by tag).
    """

    def __init__(
        self,
        settings: Any,
        store: MetadataStore,
        server: str,
        names: Sequence[str],
        restarts: RestartPolicy | None = None,
        cameras: Sequence[str] = (),
        image_size: tuple[int, int] = (64, 64),
        driver_options: Mapping[str, Any] | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> None:
        self.settings = settings
        self.tags = {**dict(tags or {}), SIM_TAG: "true"}
        self.driver_options = dict(driver_options or {})
        self.cameras = list(cameras)
        self.image_size = image_size
        self.store = store
        self.server = server
        self.names = list(names)
        self.data_dir = Path(settings.data_dir)
        self.restarts = restarts or RestartPolicy(max_restarts=20, window_s=300.0)
        self.computers: dict[str, ProcessSupervisor] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="sim-computers", daemon=True)

    def start(self) -> SimRobotComputers:
        """Start every computer (enrolling the ones that never did).

        Raises:
            RuntimeError: a robot is enrolled but its computer's credential is gone.
        """
        config = _edge_config(self.settings, self.data_dir / "robots" / "edge.yaml")
        for i, name in enumerate(self.names):
            argv = self._argv(name, config, seed=1000 * i)
            log_path = spool_root(self.data_dir, name) / "edge.log"
            self.computers[name] = ProcessSupervisor(
                f"robot-computer {name}", argv, log_path, self.restarts
            )
            self.computers[name].start()
        self._thread.start()
        return self

    def _argv(self, name: str, config: Path, seed: int) -> list[str]:
        root = spool_root(self.data_dir, name)
        argv = [
            *(sys.executable, "-m", "robofleet.cli", "edge"),
            *("--config", str(config), "--server", self.server, "--robot", name),
            *("--driver", "metaworld", "--operator", "scripted", "--spool-dir", str(root)),
            *("--seed", str(seed)),
        ]
        if self.cameras:  # rendered frames: the robot's enrolled spec has them
            argv += [
                *("--driver-option", f"cameras={json.dumps(self.cameras)}"),
                *("--driver-option", f"image_size={json.dumps(list(self.image_size))}"),
            ]
        for key, value in self.driver_options.items():
            argv += ["--driver-option", f"{key}={json.dumps(value)}"]
        token = self._token(name, root)
        if token is not None:
            argv.append(f"--token={token}")  # a token may start with "-"
        return argv

    def _token(self, name: str, root: Path) -> str | None:
        """A one-time enrollment token for a robot that never enrolled, else None."""
        with self.store.session() as s:
            robot = s.scalar(select(Robot).where(Robot.name == name))
        if robot is not None:
            if not credential_path(root).exists():
                raise RuntimeError(
                    f"robot {name} is enrolled but its credential {credential_path(root)} is gone"
                )
            return None
        return self.store.create_enrollment_token(
            timedelta(minutes=10),
            robot_name=name,
            robot_type=ROBOT_TYPE,
            tags=self.tags,
            actor="simfleet",
        )

    def wait_reported(self, timeout_s: float) -> None:
        """Wait until every computer enrolled and reports (runs lease them).

        Raises:
            RuntimeError: some did not report within ``timeout_s`` (named, with their logs).
        """
        deadline = time.monotonic() + timeout_s
        reported: set[str] = set()
        while time.monotonic() < deadline:
            with self.store.session() as s:
                rows = s.execute(select(Robot.name, Robot.stats).where(Robot.name.in_(self.names)))
                reported = {name for name, stats in rows if (stats or {}).get("state")}
            if reported == set(self.names):
                return
            time.sleep(0.2)
        raise RuntimeError(
            f"simulated robot computers {sorted(set(self.names) - reported)} did not report "
            f"within {timeout_s:.0f}s; see {self.data_dir / 'robots'}/<name>/edge.log"
        )

    def pid(self, name: str) -> int | None:
        return self.computers[name].pid

    def _watch(self) -> None:
        while not self._stop.wait(1.0):
            for name, computer in list(self.computers.items()):
                try:
                    computer.poll()
                except CrashLoop as exc:
                    log.error("robot computer %s keeps dying; left down: %s", name, exc)
                    del self.computers[name]

    def close(self, timeout_s: float = 60.0) -> None:
        """SIGTERM every computer (it leaves its run at a safe boundary), wait, then kill."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        for computer in self.computers.values():
            computer.signal(signal.SIGTERM)
        for computer in self.computers.values():
            computer.stop(timeout_s)


def sim_robots(
    n: int,
    cameras: Sequence[str] = (),
    image_size: tuple[int, int] = (64, 64),
    driver_options: Mapping[str, Any] | None = None,
) -> Callable[[Any, MetadataStore, str], SimRobotComputers]:
    """A ``robofleet.cloud.RobotStarter`` of ``n`` simulated robot computers (named
    :func:`sim_robot_names`) rendering ``cameras`` at ``image_size`` (height, width), with
    ``driver_options`` (:class:`SimRobotComputers`): it starts them and waits
    ``orchestration.robots_ready_timeout_s`` for them to report.

    Raises (when called):
        RuntimeError: they did not report in time (they are stopped first).
    """

    def start(settings: Any, store: MetadataStore, server: str) -> SimRobotComputers:
        computers = SimRobotComputers(
            settings,
            store,
            server,
            sim_robot_names(n),
            cameras=cameras,
            image_size=image_size,
            driver_options=driver_options,
        ).start()
        try:
            computers.wait_reported(settings.orchestration.robots_ready_timeout_s)
        except BaseException:
            computers.close()
            raise
        return computers

    return start
