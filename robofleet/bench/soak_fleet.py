"""The processes of ``robofleet bench soak``: one ``robofleet cloud`` process (killed and
started again on the same gRPC port), groups of simulated robot computers (real ``robofleet
edge`` processes outside the cloud's process tree, so a cloud crash leaves them running, as
it would leave a lab's robots), and the two runs they feed (state robots, camera robots)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from foundation.runspec import RunSpec
from foundation.store.metadata_store import MetadataStore
from foundation.store.models import Run, RunState
from robofleet.bench.soak_probe import children_map, cmdline, descendants
from runs.supervisor import terminate

LIVE = (RunState.RUNNING, RunState.DEGRADED)
ENDED = (RunState.FINISHED, RunState.STOPPED, RunState.CRASHED)
READY = "robofleet cloud: ready"


class CloudProcess:
    """``robofleet cloud --no-dashboard --grpc-port PORT`` with ``env``, its output appended
    to ``log``; in a session of its own, so :meth:`kill` ends its whole tree."""

    def __init__(self, env: Mapping[str, str], log: Path, port: int, num_cpus: int = 4) -> None:
        self.env = dict(env)
        self.log = log
        self.argv = [sys.executable, "-m", "robofleet.cli", "cloud", "--no-dashboard"]
        self.argv += ["--grpc-port", str(port), "--num-cpus", str(num_cpus)]
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def start(self, timeout_s: float) -> float:
        """Start it and wait for its ready line; the seconds that took.

        Raises:
            RuntimeError: it exited or was not ready within ``timeout_s`` (the log is named).
        """
        t0 = time.monotonic()
        self.log.parent.mkdir(parents=True, exist_ok=True)
        offset = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                start_new_session=True,
            )  # fmt: skip
        self.starts += 1
        while time.monotonic() - t0 < timeout_s:
            with open(self.log, "rb") as f:
                f.seek(offset)
                if READY.encode() in f.read():
                    return time.monotonic() - t0
            if self.proc.poll() is not None:
                break
            time.sleep(0.5)
        raise RuntimeError(f"robofleet cloud did not become ready; see {self.log}")

    def kill(self) -> int:
        """SIGKILL it and every process below it; how many processes that was."""
        if self.proc is None:
            return 0
        pids = [*descendants(self.proc.pid), self.proc.pid]
        _sigkill(pids)
        self.proc.wait(30)
        return len(pids)

    def stop(self, timeout_s: float) -> int | None:
        """SIGTERM (runs checkpoint and let go), wait, else :meth:`kill`; its exit code."""
        if self.proc is None:
            return None
        terminate(self.proc, timeout_s, self.kill)
        _sigkill(descendants(self.proc.pid))  # Ray's processes that outlived their driver
        return self.proc.returncode

    def roles(self) -> dict[str, list[int]]:
        """``cloud`` (the process), ``learner <run dir name>`` (each learner process), ``ray``
        (every other process below it: Ray's, the evaluators)."""
        pid = self.pid
        if pid is None:
            return {}
        out: dict[str, list[int]] = {"cloud": [pid], "ray": []}
        for child in descendants(pid, children_map()):
            argv = cmdline(child)
            if "cloud_learner.process" in argv and "--run-dir" in argv:
                run_dir = Path(argv[argv.index("--run-dir") + 1])
                out.setdefault(f"learner {run_dir.name}", []).append(child)
            else:
                out["ray"].append(child)
        return out


def _sigkill(pids: Sequence[int]) -> None:
    """SIGKILL each of ``pids``; one that is gone already is skipped."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# Metadata retention at caps a 3-minute cycle reaches (like the buffer's small segments), so a
# soak shows whether the tables stay bounded, not only the defaults' days-long headroom. Events:
# 3 per (run, robot, kind), which even the rarest kinds (a learner's death, a cloud restart)
# reach in a soak's first half; the report counts those from what its sampler saw
# (soak_report.lifecycle_events), since retention keeps only the newest 3.
METADATA_CAPS = {
    "EVERY_S": "10",
    "METRIC_POINTS_PER_SERIES": "200",
    "EVENTS_PER_KIND": "3",
    "RELEASED_LEASES_PER_ROBOT": "4",
    "CHECKPOINT_ROWS_PER_RUN": "10",
    "VERSION_ROWS_PER_RUN": "64",
}


def cloud_env(
    data_dir: Path,
    db: Path,
    *,
    segment_bytes: int,
    retention_bytes: int,
    memory_budget_bytes: int,
) -> dict[str, str]:
    """The cloud process's environment: this one, without a config file, with its data in
    ``data_dir``, its SQLite database at ``db``, the soak's buffer settings and
    :data:`METADATA_CAPS`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROBOFLEET_")}
    env.update(
        ROBOFLEET_DATA_DIR=str(data_dir),
        ROBOFLEET_DATABASE_URL=f"sqlite:///{db.as_posix()}",
        ROBOFLEET_BUFFER__SEGMENT_TARGET_BYTES=str(segment_bytes),
        ROBOFLEET_BUFFER__RETENTION_MAX_BYTES=str(retention_bytes),
        ROBOFLEET_BUFFER__MEMORY_BUDGET_BYTES=str(memory_budget_bytes),
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
        HF_HUB_OFFLINE="1",
    )
    env.update({f"ROBOFLEET_METADATA__{k}": v for k, v in METADATA_CAPS.items()})
    return env


def robot_settings(root: Path, db: Path, **sections: Any) -> Any:
    """Settings of a group of simulated robot computers: spools and logs under ``root``,
    ``sections`` (``comms=CommsSettings(...)``) as given, the defaults otherwise."""
    from robofleet.settings import Settings

    return Settings(data_dir=root, database_url=f"sqlite:///{db.as_posix()}", **sections)


def start_group(
    settings: Any,
    store: MetadataStore,
    server: str,
    names: Sequence[str],
    tag: str,
    cameras: Sequence[str] = (),
    timeout_s: float = 240.0,
) -> Any:
    """Start robot computers ``names`` (tag ``soak: <tag>``) dialing ``server``; they have
    enrolled and report when this returns.

    Raises:
        RuntimeError: some did not report within ``timeout_s``.
    """
    from robofleet.sim.computers import SimRobotComputers

    group = SimRobotComputers(
        settings, store, server, names, cameras=cameras, image_size=(32, 32), tags={"soak": tag}
    ).start()
    try:
        group.wait_reported(timeout_s)
    except BaseException:
        group.close()
        raise
    return group


def run_spec(name: str, tag: str, robots: int, minutes: float, policy_kind: str) -> RunSpec:
    """An HG-DAgger run on reach-v3 of ``robots`` simulated robots tagged ``soak: <tag>``:
    short episodes, a small policy (``mlp`` or ``cnn``), a version every 20 updates, evaluated
    on the robots, stopping after ``minutes``."""
    from foundation.runspec import parse_run_spec

    return parse_run_spec(
        {
            "version": 1,
            "name": name,
            "algorithm": "hg-dagger",
            "tasks": ["reach-v3"],
            "hyperparameters": {
                "bc_updates": 40,
                "max_episode_steps": 50,
                "eval_max_steps": 50,
                "updates_per_s": 10,
                "checkpoint_every_updates": 40,
                "batch_size": 64,
            },
            "policy": {"kind": policy_kind, "hidden_sizes": [64, 64]},
            "robots": {
                "robot_type": "metaworld-sawyer",
                "tags": {"simulated": "true", "soak": tag},
                "count": robots,
            },
            "demonstrations": {"episodes_per_task": 1},
            "learner": {"num_cpus": 0.5},
            "publish": {"every_updates": 20},
            "evaluation": {"on": "robots", "every_seconds": 30, "every_episodes": 5},
            "stop": {"minutes": minutes},
        }
    )


def run_row(store: MetadataStore, run_id: str) -> tuple[RunState, Path, str]:
    """(state, run directory, reason) of a run."""
    with store.session() as s:
        run = s.get(Run, run_id)
        assert run is not None, f"no run {run_id}"
        return run.state, Path(run.run_dir), run.reason


def env_steps(run_dir: Path) -> int:
    """The run's env steps as its last progress line says (0 before the first)."""
    path = run_dir / "progress.jsonl"
    if not path.exists():
        return 0
    lines = [x for x in path.read_text().splitlines() if x.strip()]
    try:
        return int(json.loads(lines[-1]).get("env_steps", 0)) if lines else 0
    except ValueError:  # a line being written
        return 0


def wait_for(cond: Any, timeout_s: float, what: str, poll_s: float = 1.0) -> None:
    """Return once ``cond()`` holds.

    Raises:
        RuntimeError: not within ``timeout_s`` (naming ``what``).
    """
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(poll_s)
