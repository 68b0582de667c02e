"""A real ``robofleet cloud`` process tree for tests: start, wait, query, kill with SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import select

from robofleet.store.models import Event, Lease, Run, RunState
from robofleet.store.store import MetadataStore

ROBOFLEET = [sys.executable, "-m", "robofleet.app.cli"]

FAST = {
    "bc_updates": 40,
    "demos_per_task": 1,
    "max_episode_steps": 50,
    "eval_max_steps": 50,
    "updates_per_s": 20,
    "checkpoint_every_updates": 40,
    "batch_size": 64,
}


def spec_file(
    path: Path, name: str, count: int, tags: dict[str, str] | None = None, **extra: Any
) -> Path:
    spec = {
        "version": 1,
        "name": name,
        "algorithm": "hg-dagger",
        "tasks": ["reach-v3"],
        "hyperparameters": FAST,
        "policy": {"hidden_sizes": [64, 64]},
        "robots": {
            "robot_type": "metaworld-sawyer",
            "tags": tags or {"simulated": "true"},
            "count": count,
        },
        "learner": {"num_cpus": 0.5},
        "publish": {"every_updates": 20},
        "evaluation": {"every_seconds": 15, "episodes_per_task": 2},
        **extra,
    }
    path.write_text(yaml.safe_dump(spec))
    return path


def env_for(data_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        ROBOFLEET_DATA_DIR=str(data_dir),
        ROBOFLEET_COMMS__GRPC_PORT="0",
        ROBOFLEET_HAL__OFFLINE_AFTER_S="10",
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
        HF_HUB_OFFLINE="1",
    )
    env.pop("ROBOFLEET_CONFIG", None)
    return env


class Cloud:
    """``robofleet cloud --sim-robots N`` in its own session (process group)."""

    def __init__(self, data_dir: Path, sim_robots: int) -> None:
        self.data_dir = data_dir
        self.log = open(data_dir / f"cloud-{time.time_ns()}.log", "wb")
        data_dir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                *ROBOFLEET,
                "cloud",
                "--sim-robots",
                str(sim_robots),
                "--no-dashboard",
                "--num-cpus",
                "4",
            ],
            env=env_for(data_dir),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_until(
            lambda: b"robofleet cloud: ready" in Path(self.log.name).read_bytes(),
            120,
            self.fail_text,
        )

    def fail_text(self) -> str:
        return Path(self.log.name).read_text(errors="replace")[-4000:]

    def kill_tree(self) -> list[int]:
        """SIGKILL the cloud and every descendant (Ray, edge agents, learner)."""
        pids = descendants(self.proc.pid) + [self.proc.pid]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(30)
        wait_until(lambda: not any(_alive(p) for p in pids), 30)  # every one is gone
        return pids

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.kill_tree()
        self.log.close()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().split(") ")[-1].split()[1])
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def wait_until(
    pred: Callable[[], object], timeout_s: float, why: Callable[[], str] | None = None
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s}s" + (f":\n{why()}" if why else ""))


def cli(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ROBOFLEET, *args], env=env_for(data_dir), capture_output=True, text=True, timeout=120
    )


def store_for(data_dir: Path) -> MetadataStore:
    return MetadataStore(f"sqlite:///{(data_dir / 'robofleet.db').as_posix()}")


def run_state(store: MetadataStore, run_id: str) -> RunState:
    run = store.get_run(run_id)
    assert run is not None
    return run.state


def events(store: MetadataStore, run_id: str, kind: str) -> list[dict[str, Any]]:
    with store.session() as s:
        rows = s.scalars(
            select(Event).where(Event.run_id == run_id, Event.kind == kind).order_by(Event.id)
        )
        return [dict(e.data) for e in rows]


def active_lease_robots(store: MetadataStore, run_id: str) -> set[int]:
    with store.session() as s:
        return set(
            s.scalars(
                select(Lease.robot_id).where(Lease.run_id == run_id, Lease.released_at.is_(None))
            )
        )


def run_dir(store: MetadataStore, run_id: str) -> Path:
    with store.session() as s:
        run = s.get(Run, run_id)
        assert run is not None
        return Path(run.run_dir)


def progress(store: MetadataStore, run_id: str) -> dict[str, Any]:
    path = run_dir(store, run_id) / "progress.jsonl"
    if not path.exists():
        return {}
    lines = [x for x in path.read_text().splitlines() if x.strip()]
    return json.loads(lines[-1]) if lines else {}
