"""``robofleet bench soak --minutes N``: one cloud, its learners and a simulated fleet under churn
and faults for N minutes; does the system hold?

One ``robofleet cloud`` process (data on a size-limited tmpfs, the metadata in SQLite beside
it) runs two HG-DAgger runs: state robots (MLP) and camera robots (CNN on a 32x32 camera).
Their robot computers are real ``robofleet edge`` processes outside the cloud's tree; one state
robot reaches the cloud through a TCP proxy. The buffers seal small segments and retention
deletes the oldest often. Each 3-minute cycle of the fault schedule (runs of N minutes repeat
it N // 3 times) SIGKILLs a robot computer (its init system starts it again), releases a robot's
lease and leases it back, SIGKILLs a learner, SIGKILLs the whole cloud and starts it again (the
runs resume), fills the data disk and frees it, cuts the proxied robot's network for longer
than every stream deadline and keepalive, holds idle weight subscriptions open as long, and
makes a burst of reconnects.

Every few seconds it samples each process's RSS, descriptors, threads and sockets, the
metadata database's bytes and rows, and the data directories' bytes. At the end: steps
acknowledged / stored / deleted by retention / lost / stored twice per robot (the robots'
spools against every row the buffers held, :mod:`robofleet.bench.soak_ledger`), versions
published and applied, resumes, the faults injected, and each resource's slope over the second
half of the run with its verdict (:mod:`robofleet.bench.soak_probe`). A table, then one JSON
object as the last stdout line.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from foundation.clitext import plain_text
from robofleet.bench import soak_faults, soak_fleet, soak_probe, soak_report
from robofleet.bench.soak_ledger import SegmentLedger

log = logging.getLogger(__name__)

CYCLE_S = 180.0
# One cycle of the schedule: (its share of the cycle at which it starts, fault).
CYCLE = (
    (0.03, "robot_killed"),
    (0.08, "idle_subscriptions"),
    (0.11, "network_cut"),
    (0.17, "robot_released"),
    (0.25, "disk_filled"),
    (0.42, "learner_killed"),
    (0.50, "reconnect_burst"),
    (0.60, "cloud_killed"),
)
FAULTS = tuple(kind for _, kind in CYCLE)
RELEASE_S = 12.0  # a released robot waits this long before it is leased again
DISK_FULL_S = 15.0
IDLE_SUBSCRIPTIONS = 8
RECONNECTS = 300
SCAN_S = 0.25  # how often the buffers' new sealed segments are read
WARMUP_S = 30.0  # a process's first seconds after a (re)start are not sampled


def fault_schedule(minutes: float) -> list[tuple[float, str]]:
    """(seconds into the run, fault) of a run of ``minutes``: :data:`CYCLE` repeated
    ``max(1, minutes // 3)`` times over the run, in time order."""
    if minutes <= 0:
        raise ValueError(f"--minutes must be positive, got {minutes}")
    window = minutes * 60.0
    cycles = max(1, int(window // CYCLE_S))
    length = window / cycles
    return sorted(
        (c * length + share * length, kind) for c in range(cycles) for share, kind in CYCLE
    )


def end_grace_s(minutes: float) -> float:
    """How long the soak waits, after its window, for the runs to end: 420 s, and 45 s more
    for every fault cycle past the first. A run's clock stops while its cloud is down and
    while it resumes (10-25 s a cloud kill here, more on a loaded machine), so an hour's runs
    end minutes after the window."""
    return 420.0 + 45.0 * (len(fault_schedule(minutes)) // len(CYCLE) - 1)


def beyond_deadlines(comms: Any) -> float:
    """Seconds longer than every deadline a stream has: idle timeout plus a keepalive round,
    and 5 s more."""
    return float(
        comms.stream_idle_timeout_s + comms.keepalive_time_s + comms.keepalive_timeout_s + 5
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Soak:
    """One soak in ``work`` (see the module docstring); :meth:`run` returns its summary."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        from comms.config import CommsSettings

        self.args = args
        grace = args.end_grace_s
        self.end_grace_s = end_grace_s(args.minutes) if grace is None else float(grace)
        self.work = work
        self.comms = CommsSettings()
        self.hold_s = beyond_deadlines(self.comms)
        self.db = work / "robofleet.db"
        self.data = work / "data"
        self.series: dict[str, list[tuple[float, float]]] = {}
        self.faults: dict[str, list[dict[str, Any]]] = {k: [] for k in FAULTS}
        self.runs: dict[str, str] = {}  # name -> run id
        self.ledgers: dict[str, SegmentLedger] = {}
        self.groups: dict[str, Any] = {}
        self.disk: soak_faults.FillableDisk | None = None
        self.disk_refused = ""
        self.proxy: soak_faults.CutProxy | None = None
        self.cloud: soak_fleet.CloudProcess | None = None
        self.store: Any = None
        self.t0 = time.monotonic()
        self._lock = threading.Lock()
        self._round = 0
        self._started: dict[str, tuple[object, float]] = {}  # role -> (its start, since)
        self._samples = 0  # samples taken before this one
        # (run id, kind, event id) of the resumes and learner restarts seen (soak_report)
        self.lifecycle: set[tuple[str, str, int]] = set()
        self._scanning = threading.Event()  # set: the segment scanner stops
        self._scanner = threading.Thread(target=self._scan, name="soak-ledgers", daemon=True)

    # -- set-up -------------------------------------------------------------------------------

    def setup(self) -> None:
        from foundation.store.metadata_store import MetadataStore, upgrade

        try:
            self.disk = soak_faults.FillableDisk(self.data, self.args.disk_mib)
        except PermissionError as exc:
            self.disk_refused = str(exc)
            self.data.mkdir(parents=True, exist_ok=True)
        port = _free_port()
        self.address = f"127.0.0.1:{port}"
        env = soak_fleet.cloud_env(
            self.data,
            self.db,
            segment_bytes=self.args.segment_kib * 1024,
            retention_bytes=self.args.retention_kib * 1024,
            memory_budget_bytes=256 * 1024**2,
        )
        self.cloud = soak_fleet.CloudProcess(env, self.work / "cloud.log", port)
        self.cloud.start(240)
        upgrade(f"sqlite:///{self.db.as_posix()}")
        self.store = MetadataStore(f"sqlite:///{self.db.as_posix()}")
        self.probe_credential = self._enroll_probe()
        self.proxy = soak_faults.CutProxy(self.address)
        n = self.args.robots
        state, camera = (n + 1) // 2, n // 2
        names = [f"soak-{i:02d}" for i in range(n)]
        self.cut_robot = names[0]
        self.state_robots, self.camera_robots = names[1:state], names[state:]
        comms = self.comms
        start = soak_fleet.start_group
        robots = self.work / "robots"
        self.groups["cut"] = start(
            soak_fleet.robot_settings(robots / "cut", self.db, comms=comms.model_copy(update={"data_plane": False})),
            self.store, self.proxy.address, [self.cut_robot], "state",
        )  # fmt: skip
        if self.state_robots:
            self.groups["state"] = start(
                soak_fleet.robot_settings(robots / "state", self.db, comms=comms),
                self.store, self.address, self.state_robots, "state",
            )  # fmt: skip
        self.groups["camera"] = start(
            soak_fleet.robot_settings(robots / "camera", self.db, comms=comms),
            self.store, self.address, self.camera_robots, "camera", cameras=["corner"],
        )  # fmt: skip
        from runs.manager import QueuedRunManager

        manager = QueuedRunManager(self.store, self.data)
        minutes = self.args.minutes
        for name, tag, count, kind in (
            ("soak-state", "state", state, "mlp"),
            ("soak-camera", "camera", camera, "cnn"),
        ):
            run_id = manager.launch(
                soak_fleet.run_spec(name, tag, count, minutes, kind), actor="soak"
            )
            self.runs[name] = run_id
        for name, run_id in self.runs.items():
            soak_fleet.wait_for(lambda r=run_id: self._stepping(r), 300, f"run {name} to step")
            _, run_dir, _ = soak_fleet.run_row(self.store, run_id)
            self.ledgers[name] = SegmentLedger(run_dir / "buffer")

    def _stepping(self, run_id: str) -> bool:
        state, run_dir, reason = soak_fleet.run_row(self.store, run_id)
        if state in soak_fleet.ENDED:
            raise RuntimeError(f"run {run_id} ended before the soak began: {state} {reason}")
        return state in soak_fleet.LIVE and soak_fleet.env_steps(run_dir) > 0

    def _enroll_probe(self) -> str:
        """A robot no run selects (type ``soak-probe``), for the reconnect burst."""
        from datetime import timedelta

        from comms.robot.client import enroll, make_channel

        token = self.store.create_enrollment_token(
            timedelta(minutes=10), robot_name="soak-probe", robot_type="soak-probe", actor="soak"
        )
        channel = make_channel(self.address, self.comms)
        try:
            _, credential = enroll(channel, token, "soak-probe", "soak-probe")
        finally:
            channel.close()
        return credential

    # -- the run ------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        self.setup()
        self._scanner.start()
        self.t0 = time.monotonic()
        pending = fault_schedule(self.args.minutes)
        threads: list[threading.Thread] = []
        window = self.args.minutes * 60.0
        while True:
            now = time.monotonic() - self.t0
            while pending and pending[0][0] <= now:
                _, kind = pending.pop(0)
                t = threading.Thread(target=self._inject, args=(kind,), name=f"fault-{kind}")
                t.start()
                threads.append(t)
            if now < window:  # the steady state only: not the runs' final reports after it
                self.sample()
            if (
                now >= window
                and not pending
                and not any(t.is_alive() for t in threads)
                and self._ended()
            ):
                break
            if now >= window + self.end_grace_s:
                log.error("the runs did not end within %.0fs of the window", self.end_grace_s)
                break
            time.sleep(self.args.sample_every)
        return self.finish()

    def _ended(self) -> bool:
        """Whether every run has ended; False while the cloud holds the SQLite file's lock
        past its busy timeout (a loaded machine): the loop asks again."""
        from sqlalchemy.exc import OperationalError

        try:
            return all(
                soak_fleet.run_row(self.store, r)[0] in soak_fleet.ENDED for r in self.runs.values()
            )
        except OperationalError as exc:
            if "locked" not in str(exc):
                raise
            return False

    def _inject(self, kind: str) -> None:
        at = round(time.monotonic() - self.t0, 1)
        try:
            details = getattr(self, f"_{kind}")()
        except Exception as exc:
            log.exception("fault %s failed", kind)
            details = {"error": f"{type(exc).__name__}: {exc}"}
        with self._lock:
            self.faults[kind].append({"at_s": at, **details})

    # -- faults (each returns what it did) ------------------------------------------------------

    def _pick(self, names: Sequence[str]) -> str:
        self._round += 1
        return names[self._round % len(names)]

    def _robot_killed(self) -> dict[str, Any]:
        name = self._pick(self.camera_robots + self.state_robots)
        group = self.groups["camera" if name in self.camera_robots else "state"]
        pid = group.pid(name)
        if pid is None:
            raise RuntimeError(f"robot computer {name} is not running")
        os.kill(pid, signal.SIGKILL)
        t = time.monotonic()
        soak_fleet.wait_for(lambda: group.pid(name) not in (None, pid), 120, f"{name} to restart")
        return {"robot": name, "restarted_after_s": round(time.monotonic() - t, 1)}

    def _robot_released(self) -> dict[str, Any]:
        from sqlalchemy import select

        from foundation.store.models import Robot

        name = self._pick(self.state_robots or [self.cut_robot])
        with self.store.session() as s:
            robot_id = s.scalar(select(Robot.id).where(Robot.name == name))
        run_id = self.runs["soak-state"]
        released = self.store.release_leases(run_id, [robot_id], actor="soak")
        time.sleep(RELEASE_S)
        self.store.lease_robots(run_id, [robot_id], actor="soak")
        return {"robot": name, "leases_released": released, "away_s": RELEASE_S}

    def _learner_killed(self) -> dict[str, Any]:
        assert self.cloud is not None
        name = self._pick(sorted(self.runs))
        _, run_dir, _ = soak_fleet.run_row(self.store, self.runs[name])
        role = f"learner {run_dir.name}"
        pids = self.cloud.roles().get(role, [])
        if not pids:
            raise RuntimeError(f"no learner process of {name}")
        os.kill(pids[0], signal.SIGKILL)
        t = time.monotonic()
        soak_fleet.wait_for(
            lambda: bool(set(self.cloud.roles().get(role, [])) - set(pids)) if self.cloud else False,
            180, f"the learner of {name} to restart",
        )  # fmt: skip
        return {"run": name, "restarted_after_s": round(time.monotonic() - t, 1)}

    def _cloud_killed(self) -> dict[str, Any]:
        assert self.cloud is not None
        killed = self.cloud.kill()
        time.sleep(1.0)
        ready_s = self.cloud.start(300)
        t = time.monotonic()
        for name, run_id in self.runs.items():
            soak_fleet.wait_for(
                lambda r=run_id: soak_fleet.run_row(self.store, r)[0]
                in (*soak_fleet.LIVE, *soak_fleet.ENDED),
                300, f"run {name} to resume",
            )  # fmt: skip
        return {
            "processes_killed": killed,
            "ready_after_s": round(ready_s, 1),
            "runs_live_after_s": round(time.monotonic() - t, 1),
        }

    def _disk_filled(self) -> dict[str, Any]:
        if self.disk is None:
            raise RuntimeError(self.disk_refused)
        ballast = self.disk.fill()
        time.sleep(DISK_FULL_S)
        self.disk.free()
        return {"ballast_mib": round(ballast / soak_probe.MIB, 1), "full_s": DISK_FULL_S}

    def _network_cut(self) -> dict[str, Any]:
        assert self.proxy is not None
        self.proxy.cut()
        time.sleep(self.hold_s)
        self.proxy.heal()
        return {"robot": self.cut_robot, "cut_s": self.hold_s}

    def _idle_subscriptions(self) -> dict[str, Any]:
        from edge_agent.credential import read_credential
        from robofleet.sim.computers import spool_root

        name = self.state_robots[0] if self.state_robots else self.cut_robot
        group = self.groups["state" if self.state_robots else "cut"]
        cred = read_credential(spool_root(group.data_dir, name))
        if cred is None:
            raise RuntimeError(f"robot {name} has no credential")
        got = soak_faults.idle_subscriptions(
            self.address, cred.credential, self.runs["soak-state"], self.comms,
            IDLE_SUBSCRIPTIONS, self.hold_s,
        )  # fmt: skip
        return {"robot": name, **got}

    def _reconnect_burst(self) -> dict[str, Any]:
        return soak_faults.reconnect_burst(
            self.address, self.probe_credential, self.comms, RECONNECTS
        )

    # -- samples ------------------------------------------------------------------------------

    def _add(self, name: str, value: float) -> None:
        self.series.setdefault(name, []).append((time.monotonic() - self.t0, float(value)))

    def _warm(self, role: str, started: object) -> bool:
        """Whether ``role``'s processes run for :data:`WARMUP_S` since they last (re)started
        (``started`` changes with each start): a process starting up is not a leak."""
        now = time.monotonic()
        seen = self._started.get(role)
        if seen is None or seen[0] != started:
            first = self._samples == 0  # running since before the soak's first sample
            self._started[role] = (started, now - WARMUP_S if first else now)
            return first
        return now - seen[1] >= WARMUP_S

    def sample(self) -> None:
        """One sample of every resource (module docstring)."""
        assert self.cloud is not None
        roles = self.cloud.roles()
        for group in self.groups.values():
            for name in group.names:
                pid = group.pid(name)
                roles[f"edge {name}"] = [pid] if pid is not None else []
        cloud = self.cloud.pid
        for role, pids in roles.items():
            key = (cloud, min(pids)) if role.startswith("learner") else cloud
            if not self._warm(role, key if not role.startswith("edge") else tuple(pids)):
                continue
            got = soak_probe.sum_samples(pids)
            if got is None:
                continue
            self._add(f"{role} rss MiB", got.rss_bytes / soak_probe.MIB)
            self._add(f"{role} fds", got.fds)
            self._add(f"{role} threads", got.threads)
            self._add(f"{role} sockets", got.sockets)
        try:
            size, rows = soak_probe.sqlite_figures(self.db)
            self._add("metadata db MiB", size / soak_probe.MIB)
            for table, n in rows.items():
                self._add(f"metadata rows {table}", n)
            self.lifecycle |= soak_report.lifecycle_events(self.store)
        except Exception as exc:  # locked for longer than the timeout: skip this sample
            log.info("metadata sample skipped: %s", exc)
        self._add("data dir MiB", soak_probe.dir_bytes(self.data) / soak_probe.MIB)
        self._add("robot spools MiB", soak_probe.dir_bytes(self.work / "robots") / soak_probe.MIB)
        self._samples += 1

    def _scan(self) -> None:
        """Read new sealed segments every :data:`SCAN_S` (a burst of uploads after an outage
        seals and retires segments within seconds) until the soak ends."""
        while not self._scanning.wait(SCAN_S):
            for ledger in list(self.ledgers.values()):
                try:
                    ledger.scan()
                except Exception:  # a half-written directory: the next scan reads it
                    log.exception("scanning %s", ledger.directory)

    # -- the end ------------------------------------------------------------------------------

    def finish(self) -> dict[str, Any]:
        assert self.cloud is not None
        states = {n: soak_fleet.run_row(self.store, r) for n, r in self.runs.items()}
        self.cloud.stop(180)
        self._scanning.set()
        self._scanner.join(30)
        for ledger in self.ledgers.values():
            ledger.scan()
        return soak_report.summary(self, states)

    def close(self) -> None:
        """Stop whatever still runs (robots, cloud, proxy) and unmount the disk."""
        for group in self.groups.values():
            group.close(30)
        if self.cloud is not None:
            self.cloud.stop(60)
        if self.proxy is not None:
            self.proxy.close()
        if self.store is not None:
            self.store.close()
        if self.disk is not None:
            if self.args.work is not None:  # kept for a post-mortem: the tmpfs goes
                self.disk.free()
                shutil.copytree(self.data, self.work / "data-kept", dirs_exist_ok=True)
            self.disk.close()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="robofleet bench soak", description=plain_text(__doc__.split("\n\n")[0])
    )
    p.add_argument("--config", default=None, help="(unused: the soak sets up its own cloud)")
    p.add_argument("--minutes", type=float, default=3.0, help="run length (faults: every 3 min)")
    p.add_argument("--robots", type=int, default=4, help="robot computers, 4 to 8")
    p.add_argument(
        "--sample-every",
        type=float,
        default=3.0,
        metavar="SECONDS",
        help="resource sampling interval",
    )
    p.add_argument("--segment-kib", type=int, default=256, help="buffer segment size")
    p.add_argument("--retention-kib", type=int, default=1536, help="buffer retention limit")
    p.add_argument("--disk-mib", type=int, default=256, help="the data tmpfs's size")
    p.add_argument("--end-grace-s", type=float, default=None,
                   help="longest wait for the runs to end after the last minute (default: "
                   "420 s + 45 s a fault cycle past the first)")  # fmt: skip
    p.add_argument("--work", type=Path, default=None, help="keep the soak's files here")
    return p


def main(argv: Sequence[str] = ()) -> int:
    parser = build_parser()
    args = parser.parse_args(list(argv))
    if not 4 <= args.robots <= 8:
        parser.error(f"--robots must be 4 to 8, got {args.robots}")
    if args.minutes <= 0 or args.sample_every <= 0:
        parser.error("--minutes and --sample-every must be positive")
    logging.basicConfig(level=logging.WARNING)
    work = args.work or Path(tempfile.mkdtemp(prefix="robofleet-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    soak = Soak(args, work)
    t0 = time.monotonic()
    try:
        summary = soak.run()
    finally:
        soak.close()
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    summary["wall_s"] = round(time.monotonic() - t0, 1)
    if args.work is not None:  # every sampled series, for a look beyond the verdicts
        (work / "series.json").write_text(json.dumps(soak.series))
    soak_report.print_tables(summary)
    print(json.dumps(summary, default=str), flush=True)
    return 0 if summary["ok"] else 1
