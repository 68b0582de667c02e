"""What the orchestration system tests read of a run, from the metadata store and its run
directory, and the run spec they launch (the cloud itself is tests.fakes.cloud.RobofleetCloud)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from sqlalchemy import select

from buffer import ReplayBuffer
from buffer.service.shards import shard_of
from foundation.store.metadata_store import MetadataStore, upgrade
from foundation.store.models import Event, Lease, Robot, Run, RunState
from runs.accounting import acked_total
from tests.fakes import procs
from tests.fakes.cloud import RobofleetCloud, cli, store_for
from tests.fakes.settings import FAST_RUN

LIVE = (RunState.RUNNING, RunState.DEGRADED)
ENDED = (RunState.FINISHED, RunState.STOPPED)
SHARDS = 2  # buffer shards of the sharded runs (:func:`ids_apart`)


def wait_until(
    cond: Callable[[], object], timeout_s: float, what: str | Callable[[], str] = ""
) -> None:
    """:func:`tests.fakes.procs.wait_until`, polling every 0.5 s: the store and files it reads
    are the busy cloud's."""
    procs.wait_until(cond, timeout_s, what, poll_s=0.5)


def spec_file(
    path: Path, name: str, count: int, tags: dict[str, str] | None = None, **extra: Any
) -> Path:
    """Write a run spec of ``count`` simulated Sawyers that learns in seconds (``FAST_RUN``)."""
    spec = {
        "version": 1,
        "name": name,
        "algorithm": "hg-dagger",
        "tasks": ["reach-v3"],
        "hyperparameters": FAST_RUN,
        "policy": {"hidden_sizes": [64, 64]},
        "robots": {
            "robot_type": "metaworld-sawyer",
            "tags": tags or {"simulated": "true"},
            "count": count,
        },
        "demonstrations": {"episodes_per_task": 1},
        "learner": {"num_cpus": 0.5},
        "publish": {"every_updates": 20},
        "evaluation": {"on": "simulator", "every_seconds": 15, "episodes_per_task": 2},
        **extra,
    }
    path.write_text(yaml.safe_dump(spec))
    return path


def run_spools(data_dir: Path, run_id: str) -> list[Path]:
    """The spools of run ``run_id`` on the simulated robot computers of the cloud in
    ``data_dir`` (``<data_dir>/robots/<robot>/runs/<run_id>``, ``edge_agent.host``)."""
    return sorted(data_dir.glob(f"robots/*/runs/{run_id}"))


def launch(data_dir: Path, spec: Path) -> str:
    """``robofleet run launch SPEC`` beside the cloud on ``data_dir``; the new run's id."""
    out = cli(data_dir, "run", "launch", str(spec), "--json")
    assert out.returncode == 0, out.stderr
    return str(json.loads(out.stdout.strip().splitlines()[-1])["run_id"])


def start_run(
    data_dir: Path, store: MetadataStore, spec: Path, cloud: RobofleetCloud, steps: int
) -> str:
    """:func:`launch` ``spec``, then wait until the run is live (150 s) and its robots have
    taken more than ``steps`` steps (90 s); the run's id."""
    run_id = launch(data_dir, spec)
    wait_until(lambda: run_state(store, run_id) in LIVE, 150, cloud.fail_text)
    wait_until(lambda: progress(store, run_id).get("env_steps", 0) > steps, 90, cloud.fail_text)
    return run_id


def stop_and_report(
    data_dir: Path,
    store: MetadataStore,
    run_id: str,
    cloud: RobofleetCloud,
    requested: bool = False,
) -> dict[str, Any]:
    """Stop the run (unless its stop is already ``requested``), wait until it has ended with
    every lease released and some steps acknowledged; its ``report.json``."""
    if not requested:
        out = cli(data_dir, "run", "stop", run_id)
        assert out.returncode == 0, out.stderr
    wait_until(lambda: run_state(store, run_id) in ENDED, 120, cloud.fail_text)
    assert active_lease_robots(store, run_id) == set()
    report: dict[str, Any] = json.loads((run_dir(store, run_id) / "report.json").read_text())
    assert acked_total(run_spools(data_dir, run_id)) > 0
    return report


def ids_apart(data_dir: Path) -> None:
    """Enroll robots not of the run's type first, so that the two simulated robots get ids
    that hash to different ones of :data:`SHARDS` shards (ids 1 and 2 share one of 2)."""
    placeholders = next(
        p for p in range(10) if shard_of(str(p + 1), SHARDS) != shard_of(str(p + 2), SHARDS)
    )
    upgrade(f"sqlite:///{(data_dir / 'robofleet.db').as_posix()}")
    with store_for(data_dir).session() as s:
        for i in range(placeholders):
            s.add(Robot(name=f"placeholder-{i}", robot_type="not-a-sawyer"))


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


def robot_step_versions(directory: Path) -> np.ndarray:
    """The policy version of each robot step in a run's buffer (not the demonstrations'), read
    from the run directory ``directory`` of a run that is not running."""
    buf = ReplayBuffer.open(directory / "buffer", read_only=True)
    try:
        steps = buf.read_transitions(buf.select(), count=False)
    finally:
        buf.close()
    robot = np.array([str(r) != "demo" for r in steps["robot_id"]], dtype=bool)
    return np.asarray(steps["policy_version"][robot])


def algorithm_sampler(
    algorithm: str,
    *,
    offline: bool = False,
    shares: dict[str, float] | None = None,
    **buffer: Any,
) -> Any:
    """The sampler a run of ``algorithm`` gives its batch service (its builder's), for a run
    spec with these ``buffer`` fields; ``shares``: the service's adaptive per-task shares."""
    from cloud_learner.run_plan import RunPlan, parse_spec

    spec = parse_spec(
        {
            "algorithm": algorithm,
            "tasks": ["reach-v3", "push-v3"],
            "robots": {"robot_type": "metaworld-sawyer"},
            "buffer": buffer,
        }
    )
    return RunPlan.from_spec(spec).sampler(offline, {} if shares is None else shares)
