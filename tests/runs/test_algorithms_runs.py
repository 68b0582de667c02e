"""RECAP and SAC/RLPD runs end to end through the run manager, on a real ``robofleet cloud``
(real Ray, gRPC, Meta-World robots with the scripted operator, buffer, learner process,
evaluator). One cloud with two simulated robots runs both short runs at once on disjoint
robots; each test checks its own run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from cloud_learner.metrics import read_metrics
from foundation.store.models import RunState
from tests.fakes.cloud import RobofleetCloud, cli, store_for
from tests.fakes.settings import FAST_RUN
from tests.runs.helpers import (
    active_lease_robots,
    robot_step_versions,
    run_dir,
    run_state,
    spec_file,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

RUNS = {
    # algorithm: (policy kind, loss keys only that algorithm's update reports)
    "recap": ("mlp", {"value_loss", "advantage_mean", "positive_fraction"}),
    "sac": ("gaussian", {"critic_loss", "q_mean", "alpha", "entropy"}),
}
ENDED = (RunState.FINISHED, RunState.STOPPED)


@pytest.fixture(scope="module")
def runs(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[RobofleetCloud, Path, dict[str, str]]]:
    data_dir = tmp_path_factory.mktemp("algorithms")
    cloud = RobofleetCloud(data_dir, sim_robots=2)
    try:
        ids: dict[str, str] = {}
        for algorithm, (kind, _) in RUNS.items():
            spec = spec_file(
                data_dir / f"{algorithm}.yaml",
                algorithm,
                1,
                algorithm=algorithm,
                policy={"kind": kind, "hidden_sizes": [64, 64]},
                stop={"env_steps": 150},  # robots boot slowly on a loaded machine
            )
            out = cli(data_dir, "run", "launch", str(spec), "--json")
            assert out.returncode == 0, out.stderr
            ids[algorithm] = str(json.loads(out.stdout.strip().splitlines()[-1])["run_id"])
        yield cloud, data_dir, ids
    finally:
        cloud.stop()


@pytest.mark.parametrize("algorithm", sorted(RUNS))
def test_short_run_trains_publishes_and_robots_act_with_it(
    runs: tuple[RobofleetCloud, Path, dict[str, str]], algorithm: str
) -> None:
    cloud, data_dir, ids = runs
    store = store_for(data_dir)
    run_id = ids[algorithm]
    wait_until(lambda: run_state(store, run_id) in ENDED, 240, cloud.fail_text)
    assert run_state(store, run_id) == RunState.FINISHED
    assert active_lease_robots(store, run_id) == set()
    directory = run_dir(store, run_id)

    report = json.loads((directory / "report.json").read_text())
    assert report["acked_lost"] == 0
    assert report["versions_published"] >= 2
    assert report["initial_success"] is not None and report["final_success"] is not None

    # The learner ran this algorithm's updates online, past the BC warm start.
    rows = read_metrics(directory)
    keys = RUNS[algorithm][1]
    online = [r for r in rows if keys <= set(r) and r["step"] > FAST_RUN["bc_updates"]]
    assert online, f"no learner metrics with {sorted(keys)} in {directory / 'metrics.jsonl'}"
    assert all(np.isfinite(r["loss"]) for r in online)
    other = RUNS["sac" if algorithm == "recap" else "recap"][1]
    assert not any(other & set(r) for r in rows)

    # The robot's own steps were acted by published versions beyond the initial one.
    versions = robot_step_versions(directory)
    assert len(versions) > 20
    assert int(versions.max()) >= 2
