"""The learner process entry point: settings overrides, evaluation episodes on Meta-World,
published versions and checkpoints recorded in the metadata store, refusal exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import select

from cloud_learner.learner_main import EXIT_REFUSED, main
from cloud_learner.metrics import read_metrics
from robofleet.store.models import Checkpoint, Event, PolicyVersion, Run
from robofleet.store.store import MetadataStore, upgrade
from tests.cloud_learner.helpers import columns


def _args(run_dir: Path, data: Path, *extra: str) -> list[str]:
    policy = {"state_dim": 39, "action_dim": 4, "hidden": 16}
    return [
        "--run-dir",
        str(run_dir),
        "--source",
        f"npz:{data}",
        "--set",
        "min_transitions=1",
        "--set",
        "batch_size=16",
        "--set",
        "max_updates=4",
        "--set",
        "publish_every_updates=2",
        "--set",
        "checkpoint_every_updates=4",
        "--set",
        "log_every_updates=1",
        "--set",
        f"policy={json.dumps(policy)}",
        "--set",
        'tasks=["reach-v3"]',
        "--set",
        "eval_every_updates=4",
        "--set",
        "eval_episodes=2",
        "--set",
        "eval_max_steps=20",
        "--set",
        'device="cpu"',
        *extra,
    ]


def test_learner_main_trains_evaluates_and_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path}/meta.db"
    upgrade(url)
    store = MetadataStore(url)
    with store.session() as s:
        s.add(Run(id="run-1", algorithm="hg_dagger"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ROBOFLEET_DATABASE_URL", url)
    data = tmp_path / "data.npz"
    np.savez(data, **columns(n=64, state_dim=39, action_dim=4))
    run_dir = tmp_path / "run"

    assert main(_args(run_dir, data, "--run-id", "run-1")) == 0

    evals = read_metrics(run_dir, prefix="eval")
    assert len(evals) == 1 and evals[0]["step"] == 4
    assert 0.0 <= evals[0]["success/reach-v3"] <= 1.0
    with store.session() as s:
        versions = s.scalars(select(PolicyVersion.version).where(PolicyVersion.run_id == "run-1"))
        assert sorted(versions) == [1, 2]
        ckpts = s.scalars(select(Checkpoint.learner_step).where(Checkpoint.run_id == "run-1"))
        assert sorted(ckpts) == [4, 4]  # the periodic one, then the final one at stop
        kinds = set(s.scalars(select(Event.kind).where(Event.run_id == "run-1")))
        assert kinds == {"learner.published", "learner.checkpoint"}
    store.close()

    # Again without --resume: refused, exit code 4. A bad override: exit code 2.
    assert main(_args(run_dir, data)) == EXIT_REFUSED
    assert main(_args(run_dir, data, "--set", "batch_size=0")) == 2
    assert main(_args(run_dir, data, "--set", "no_such_key=1")) == 2
