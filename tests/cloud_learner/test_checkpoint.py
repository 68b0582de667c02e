"""Checkpoint round trips (bit-exact), atomic keep-K, and the refusal cases."""

from __future__ import annotations

import copy
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from cloud_learner.checkpoint import (
    CheckpointError,
    CheckpointManager,
    IncompatibleCheckpoint,
    RunDirHasCheckpoints,
)
from cloud_learner.config import LearnerSettings
from cloud_learner.factory import build_algorithm, model_config
from cloud_learner.loop import Learner
from cloud_learner.publisher import InMemoryWeightPublisher
from cloud_learner.sources import InMemorySource
from tests.cloud_learner.helpers import columns

CPU = torch.device("cpu")


def _settings(algorithm: str, **kw: object) -> LearnerSettings:
    base: dict[str, object] = dict(
        algorithm=algorithm,
        min_transitions=10,
        batch_size=16,
        log_every_updates=1,
        publish_every_updates=5,
        checkpoint_every_updates=10,
        keep_checkpoints=2,
        policy={"state_dim": 5, "action_dim": 2, "hidden": 32, "num_tasks": 2},
    )
    if algorithm == "recap":
        base["algorithm_config"] = {"indicator_dropout": 0.5}
    base.update(kw)
    return LearnerSettings.model_validate(base)


def _learner(
    run_dir: Path, settings: LearnerSettings, spec: dict[str, object] | None = None
) -> Learner:
    return Learner(
        run_dir,
        build_algorithm(settings, CPU),
        InMemorySource(columns(num_tasks=2), seed=1),
        InMemoryWeightPublisher(),
        settings,
        model_config(settings),
        spec=spec,
    )


def _flat(state: object, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    if isinstance(state, dict):
        for k, v in state.items():
            out.update(_flat(v, f"{prefix}/{k}"))
    elif isinstance(state, list | tuple):
        for i, v in enumerate(state):
            out.update(_flat(v, f"{prefix}/{i}"))
    else:
        out[prefix] = state
    return out


@pytest.mark.parametrize("algorithm", ["hg_dagger", "recap", "sac_rlpd"])
def test_round_trip_is_bit_exact_and_training_continues_identically(
    tmp_path: Path, algorithm: str
) -> None:
    settings = _settings(algorithm, max_updates=10)
    a = _learner(tmp_path / "a", settings)
    a.start(resume=False)
    a.run()  # 10 updates, checkpoint at step 10
    saved = _flat(copy.deepcopy(a.algorithm.state_dict()))
    # Uninterrupted: 5 more updates in the same process.
    a.settings = _settings(algorithm, max_updates=15)
    a.run()
    a.close()

    b = _learner(tmp_path / "a", _settings(algorithm, max_updates=15))
    random.random(), np.random.rand(), torch.rand(3)  # disturb the RNGs: restore must fix them
    assert b.start(resume=True)
    restored = _flat(b.algorithm.state_dict())
    assert saved.keys() == restored.keys()
    for key, value in saved.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, restored[key]), key  # type: ignore[arg-type]
        else:
            assert value == restored[key], key
    b.run()
    b.close()
    # Same RNG, sampler and optimizer state -> the continued run matches the uninterrupted one.
    for (k, x), (_, y) in zip(
        a.algorithm.get_weights().items(), b.algorithm.get_weights().items(), strict=True
    ):
        assert torch.equal(x, y), k


def test_rng_states_round_trip(tmp_path: Path) -> None:
    learner = _learner(tmp_path, _settings("hg_dagger"))
    learner.start(resume=False)
    random.seed(7), np.random.seed(7), torch.manual_seed(7)
    learner.save_checkpoint()
    expected = (random.random(), np.random.rand(), torch.rand(2))
    state = CheckpointManager(tmp_path).load()
    from cloud_learner.checkpoint import restore_rng

    restore_rng(state.rng)
    got = (random.random(), np.random.rand(), torch.rand(2))
    assert got[0] == expected[0] and got[1] == expected[1] and torch.equal(got[2], expected[2])


def test_keeps_last_k_and_ignores_half_written_temp_dirs(tmp_path: Path) -> None:
    learner = _learner(tmp_path, _settings("hg_dagger", max_updates=50))
    learner.start(resume=False)
    learner.run()
    learner.close()
    manager = CheckpointManager(tmp_path, keep=2)
    assert [p.name for p in manager.list()] == ["step-0000000040", "step-0000000050"]
    # A crash mid-save leaves a temp dir: never listed, swept on the next start.
    tmp = manager.directory / ".tmp-step-0000000060-123"
    tmp.mkdir()
    (tmp / "tensors.safetensors").write_bytes(b"partial")
    assert manager.latest() == manager.directory / "step-0000000050"
    resumed = _learner(tmp_path, _settings("hg_dagger", max_updates=50))
    assert resumed.start(resume=True) and resumed.step == 50
    assert not tmp.exists()


def test_refuses_to_overwrite_a_run_with_checkpoints(tmp_path: Path) -> None:
    learner = _learner(tmp_path, _settings("hg_dagger", max_updates=10))
    learner.start(resume=False)
    learner.run()
    learner.close()
    again = _learner(tmp_path, _settings("hg_dagger"))
    with pytest.raises(RunDirHasCheckpoints, match="step-0000000010.*resume"):
        again.start(resume=False)
    assert CheckpointManager(tmp_path).latest() is not None  # nothing was removed


def test_incompatible_config_names_the_keys(tmp_path: Path) -> None:
    learner = _learner(tmp_path, _settings("hg_dagger", max_updates=10))
    learner.start(resume=False)
    learner.run()
    learner.close()
    changed = _settings(
        "hg_dagger",
        policy={"state_dim": 5, "action_dim": 2, "hidden": 64, "num_tasks": 2},
        algorithm_config={"lr": 0.1},
    )
    with pytest.raises(IncompatibleCheckpoint) as err:
        _learner(tmp_path, changed).start(resume=True)
    msg = str(err.value)
    assert "policy.hidden: checkpoint has 32, this run has 64" in msg
    assert "algorithm_config.lr" in msg


@pytest.mark.parametrize("kept_spec", [True, False])
def test_a_refused_resume_names_each_tensor_and_the_key_behind_it(
    tmp_path: Path, kept_spec: bool
) -> None:
    def spec(hidden: int) -> dict[str, object] | None:
        return {"policy": {"hidden_sizes": [hidden, hidden]}} if kept_spec else None

    learner = _learner(tmp_path, _settings("hg_dagger", max_updates=10), spec(32))
    learner.start(resume=True)
    learner.run()
    learner.close()
    wider = {"state_dim": 5, "action_dim": 2, "hidden": 64, "num_tasks": 2}
    with pytest.raises(IncompatibleCheckpoint) as err:
        _learner(tmp_path, _settings("hg_dagger", policy=wider), spec(64)).start(resume=True)
    msg = str(err.value)
    # The spec's key when the checkpoint kept its spec, else the learner config's.
    key = (
        "policy.hidden_sizes: checkpoint has [32, 32], this run has [64, 64]"
        if kept_spec
        else "policy.hidden: checkpoint has 32, this run has 64"
    )
    assert msg.startswith("cannot resume from checkpoint step-0000000010: its tensors do not")
    for tensor in (
        "policy.head.0.weight: this run shape (64, 7), checkpoint (32, 7)",
        "policy.head.2.weight: this run shape (64, 64), checkpoint (32, 32)",
        "policy.head.4.weight: this run shape (2, 64), checkpoint (2, 32)",
    ):
        assert f"{tensor} ({key})" in msg, msg
    assert "head.4.bias" not in msg and "optimizer" not in msg
    assert msg.endswith(
        "differs from the checkpoint's in policy.hidden: checkpoint has 32, this run has 64"
    )


def test_mismatching_tensors_are_named(tmp_path: Path) -> None:
    learner = _learner(tmp_path, _settings("hg_dagger", max_updates=10))
    learner.start(resume=False)
    learner.run()
    learner.close()
    state = CheckpointManager(tmp_path).load()
    other = build_algorithm(
        _settings(
            "hg_dagger", policy={"state_dim": 5, "action_dim": 3, "hidden": 32, "num_tasks": 2}
        ),
        CPU,
    )
    with pytest.raises(
        ValueError, match=r"head\.4\.weight: expected shape \(3, 32\), got \(2, 32\)"
    ):
        other.load_state_dict(state.algorithm)


def test_corrupt_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    learner = _learner(tmp_path, _settings("hg_dagger", max_updates=10))
    learner.start(resume=False)
    learner.run()
    learner.close()
    latest = CheckpointManager(tmp_path).latest()
    assert latest is not None
    (latest / "tensors.safetensors").write_bytes(b"\x00" * 10)
    with pytest.raises(CheckpointError, match="unreadable"):
        CheckpointManager(tmp_path).load()
