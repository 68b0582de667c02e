"""The run side is the one writer of a run's version rows: it records the versions the learner
journals once their files are out, and its complete checkpoints, each once, again after a
restart of the cloud (a resumed run finds them all)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import select

from cloud_learner.loop import PUBLISHED
from comms.cloud.weight_file import WeightDirectory
from foundation.store.metadata_store import MetadataStore, upgrade
from foundation.store.models import Checkpoint, Event, PolicyVersion, Run
from runs.versions import VersionRecorder


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MetadataStore]:
    url = f"sqlite:///{tmp_path}/meta.db"
    upgrade(url)
    s = MetadataStore(url)
    with s.session() as sess:
        sess.add(Run(id="run-1", algorithm="hg-dagger"))
    yield s
    s.close()


def journal(run_dir: Path, *lines: str) -> None:
    with (run_dir / PUBLISHED).open("a") as f:
        for line in lines:
            f.write(line)


def entry(version: int) -> str:
    return json.dumps({"version": version, "learner_step": 10 * version, "num_bytes": 64}) + "\n"


def checkpoint(run_dir: Path, step: int, version: int) -> None:
    d = run_dir / "checkpoints" / f"step-{step:010d}"
    d.mkdir(parents=True)
    (d / "state.json").write_text(json.dumps({"learner_step": step, "policy_version": version}))


def rows(store: MetadataStore) -> tuple[list[tuple[int, int]], list[tuple[int, int]], list[str]]:
    with store.session() as s:
        versions = [(v.version, v.learner_step) for v in s.scalars(select(PolicyVersion))]
        ckpts = [(c.learner_step, c.policy_version) for c in s.scalars(select(Checkpoint))]
        kinds = sorted(s.scalars(select(Event.kind).where(Event.run_id == "run-1")))
    return sorted(versions), sorted(ckpts), kinds


def test_versions_out_and_checkpoints_are_recorded_once(
    tmp_path: Path, store: MetadataStore
) -> None:
    run_dir = tmp_path / "run"
    weights = WeightDirectory(run_dir / "weights")
    weights.publish(1, {"w": np.zeros(4, np.float32)})
    # Version 2 is journalled but its file is not out yet; a torn line is skipped.
    journal(run_dir, entry(1), '{"version": 9, "learn\n', entry(2))
    checkpoint(run_dir, 10, 1)
    recorder = VersionRecorder(store, "run-1", run_dir)
    recorder.poll()
    assert rows(store) == ([(1, 10)], [(10, 1)], ["learner.checkpoint", "learner.published"])
    weights.publish(2, {"w": np.ones(4, np.float32)})
    journal(run_dir, entry(3)[:5])  # being written
    recorder.poll()
    assert rows(store)[0] == [(1, 10), (2, 20)]
    # The cloud restarts: a new recorder reads everything again and adds nothing twice.
    checkpoint(run_dir, 20, 2)
    VersionRecorder(store, "run-1", run_dir).poll()
    versions, ckpts, kinds = rows(store)
    assert versions == [(1, 10), (2, 20)] and ckpts == [(10, 1), (20, 2)]
    assert kinds.count("learner.published") == 2 and kinds.count("learner.checkpoint") == 2
