"""SIGKILL the learner process mid-training, then resume it: parameters, metric steps and
weight versions continue."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file

from cloud_learner.checkpoint import CheckpointManager
from cloud_learner.metrics import read_metrics
from tests.cloud_learner.helpers import columns

POLICY = json.dumps({"state_dim": 5, "action_dim": 2, "hidden": 32})


def _learner(run_dir: Path, data: Path, *extra: str) -> subprocess.Popen[str]:
    cmd = [
        sys.executable,
        "-m",
        "cloud_learner.learner_main",
        "--run-dir",
        str(run_dir),
        "--source",
        f"npz:{data}",
        "--set",
        "min_transitions=1",
        "--set",
        "batch_size=32",
        "--set",
        "checkpoint_every_updates=20",
        "--set",
        "log_every_updates=1",
        "--set",
        "publish_every_updates=10",
        "--set",
        f"policy={POLICY}",
        "--set",
        "torch_threads=1",
        "--set",
        'device="cpu"',
        *extra,
    ]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.Popen(
        cmd, cwd=run_dir.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _wait_for(predicate: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError("timed out waiting for the learner")


@pytest.mark.slow
def test_sigkill_mid_training_then_resume(tmp_path: Path) -> None:
    data = tmp_path / "data.npz"
    np.savez(data, **columns(n=2000))
    run_dir = tmp_path / "run"
    manager = CheckpointManager(run_dir)

    first = _learner(run_dir, data)
    try:
        # Kill after at least two checkpoints and some un-checkpointed progress.
        def progressed() -> bool:
            found = manager.list()
            steps = [m["step"] for m in read_metrics(run_dir)]
            return len(found) >= 2 and bool(steps) and steps[-1] >= manager_step() + 7

        def manager_step() -> int:
            latest = manager.latest()
            return int(latest.name.removeprefix("step-")) if latest else 10**9

        _wait_for(progressed, timeout=120)
        os.kill(first.pid, signal.SIGKILL)
    finally:
        first.wait(timeout=30)
        assert first.stdout is not None and first.stderr is not None
        first.stdout.close(), first.stderr.close()
    assert first.returncode == -signal.SIGKILL

    ckpt = manager.load()
    killed_at = max(m["step"] for m in read_metrics(run_dir))
    # Updates logged after the last checkpoint (usually some) are redone after the resume.
    assert killed_at >= ckpt.learner_step
    pointer = json.loads((run_dir / "weights" / "latest.json").read_text())
    version_before = pointer["version"]

    # Starting again without --resume refuses and touches nothing.
    refused = _learner(run_dir, data)
    out, err = refused.communicate(timeout=120)
    assert refused.returncode == 4, err
    assert "already has checkpoints" in err and "resume" in err
    assert manager.load().learner_step == ckpt.learner_step

    target = ckpt.learner_step + 15  # publishes at resume and at +10: both files kept
    resumed = _learner(run_dir, data, "--resume", "--set", f"max_updates={target}")
    out, err = resumed.communicate(timeout=180)
    assert resumed.returncode == 0, err
    assert f"resumed {manager.directory}/step-{ckpt.learner_step:010d}" in err

    # Parameters continue: the first version published after resume is the checkpoint's policy.
    first_new = run_dir / "weights" / f"v{version_before + 1:08d}.safetensors"
    shipped = load_file(str(first_new))
    for key, value in ckpt.algorithm["policy"].items():
        assert (shipped[key] == value).all(), key
    # Weight versions only increase; robots get new versions after the resume.
    pointer = json.loads((run_dir / "weights" / "latest.json").read_text())
    assert pointer["version"] > version_before + 1
    # Metric steps continue without gap or duplicate, in JSON lines and in TensorBoard.
    steps = [m["step"] for m in read_metrics(run_dir)]
    assert steps == list(range(1, target + 1))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("learner/loss")] == list(range(1, target + 1))
    assert manager.load().learner_step == target
