"""The launch form's offline data: the API lists the catalog's datasets and the runs with a
buffer (with whether a run has a promoted version to start from); a version of a run is
promoted from its weights on disk, and one no longer there is refused by name."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from buffer import ReplayBuffer, StepSchema
from comms.cloud.weight_file import WeightDirectory
from foundation.runspec import parse_run_spec
from foundation.store.accounts import Role
from foundation.store.metadata_store import MetadataStore
from foundation.store.models import PolicyVersion
from foundation.store.runs import record_run
from lab_data.catalog import DatasetCatalog
from robofleet.settings import Settings
from runs.starting import PromotionError, promote_from_disk

SCHEMA = StepSchema.from_features(
    {"observation.state": {"dtype": "float32", "shape": (2,)}},
    {"action": {"dtype": "float32", "shape": (1,)}},
    require_final_observation=False,
)


def _fill(directory: Path) -> None:
    buf = ReplayBuffer.open(directory, SCHEMA)
    rows = [
        {
            "seq": i,
            "robot_id": "arm",
            "run_id": "old",
            "task": "reach-v3",
            "episode_index": 0,
            "frame_index": i,
            "timestamp": float(i),
            "reward": 0.0,
            "terminated": False,
            "truncated": i == 4,
            "is_intervention": True,
            "policy_version": 0,
            "action": np.zeros(1, np.float32),
            "observation.state": np.zeros(2, np.float32),
        }
        for i in range(5)
    ]
    buf.append(SCHEMA.batch_from_records(rows))
    buf.close()


@pytest.fixture
def old_run(settings: Settings, store: MetadataStore) -> str:
    spec = parse_run_spec(
        {"algorithm": "hg-dagger", "tasks": ["reach-v3"], "robots": {"robot_type": "x"}}
    )
    run_id = record_run(store, spec, Path(settings.data_dir) / "runs", actor="test")
    run = store.get_run(run_id)
    assert run is not None
    _fill(Path(run.run_dir) / "buffer")
    weights = WeightDirectory(Path(run.run_dir) / "weights", keep=2)
    for version in (1, 2, 3):
        weights.publish(version, {"w": torch.full((2,), float(version))})
        with store.session() as s:
            s.add(PolicyVersion(run_id=run_id, version=version, learner_step=version, num_bytes=8))
    return run_id


def test_the_launch_form_lists_datasets_and_runs_to_mount(
    settings: Settings, old_run: str, as_role: Callable[[Role], TestClient]
) -> None:
    DatasetCatalog(Path(settings.data_dir) / "datasets").create("teleop", _fill, format="lerobot")
    got = as_role(Role.VIEWER).get("/api/offline-sources")
    assert got.status_code == 200, got.text
    by_name = {s["name"]: s for s in got.json()}
    assert by_name["teleop"]["kind"] == "dataset" and by_name["teleop"]["rows"] == 5
    assert by_name["teleop"]["tasks"]
    assert by_name[old_run]["kind"] == "run" and by_name[old_run]["tasks"] == ["reach-v3"]
    assert by_name[old_run]["promoted"] is False


def test_a_version_still_on_disk_is_promoted_and_an_old_one_refused(
    store: MetadataStore, old_run: str
) -> None:
    run = store.get_run(old_run)
    assert run is not None
    with pytest.raises(PromotionError, match=r"version 1 .* no longer on disk \(kept: \[2, 3\]\)"):
        promote_from_disk(store, old_run, 1)
    assert promote_from_disk(store, old_run) == 3  # the newest by default
    assert promote_from_disk(store, old_run, 2) == 2
    promoted = json.loads((Path(run.run_dir) / "promoted.json").read_text())
    assert promoted == {"version": 2, "by": "manual"}
    weights = (Path(run.run_dir) / "weights" / "v00000002.safetensors").read_bytes()
    assert (Path(run.run_dir) / "promoted.safetensors").read_bytes() == weights
    with store.session() as s:
        flags = {v.version: v.promoted for v in s.query(PolicyVersion).filter_by(run_id=old_run)}
    assert flags == {1: False, 2: True, 3: False}
    with pytest.raises(PromotionError, match="no run 'nope'"):
        promote_from_disk(store, "nope")
