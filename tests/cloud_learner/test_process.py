"""The learner process of a run (``python -m cloud_learner.process``), as the run driver starts
it: against the run's buffer service in another process. SIGKILL it mid-training and start it
again: parameters, metric steps and weight versions continue; the run side records versions
and checkpoints in the metadata store (``runs.versions``). Also: the device a spec's ``learner.num_gpus`` asks for, and the refusal
(exit 4) of a checkpoint the spec no longer fits. Pacing (samples per insert) is
``buffer.RateLimiter``'s: tests/buffer/test_rate_limiter.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from sqlalchemy import select

from buffer import BufferSettings, InterventionSampler, ReplayBuffer, StepSchema
from buffer.service.batch_token import TOKEN_ENV
from buffer.service.batches import BatchServer
from cloud_learner.checkpoint import CheckpointManager
from cloud_learner.metrics import read_metrics
from cloud_learner.process import EXIT_REFUSED, RunLearner, learner_device, read_refusal
from comms.cloud.weight_file import WeightDirectory
from foundation.store.metadata_store import MetadataStore, upgrade
from foundation.store.models import Checkpoint, Event, PolicyVersion, Run
from runs.versions import VersionRecorder
from tests.buffer.helpers import BATCH_TOKEN
from tests.cloud_learner.helpers import ACTION, STATE, rows

TASKS = ["reach-v3"]


def spec(hidden: int = 32, **extra: Any) -> dict[str, Any]:
    return {
        "version": 1,
        "algorithm": "hg-dagger",
        "tasks": TASKS,
        "policy": {"kind": "mlp", "hidden_sizes": [hidden, hidden]},
        "robots": {"robot_type": "metaworld-sawyer", "count": 1},
        "hyperparameters": {
            "bc_updates": 5,
            "batch_size": 32,
            "checkpoint_every_updates": 20,
            "updates_per_s": 0,
        },
        "publish": {"every_updates": 10},
        **extra,
    }


class Run_:
    """A run directory with its spec, its buffer, the buffer's service and a metadata store."""

    def __init__(self, tmp: Path) -> None:
        self.dir = tmp / "run"
        self.dir.mkdir()
        (self.dir / "spec.json").write_text(json.dumps(spec()))
        schema = StepSchema.from_features({"observation.state": STATE}, {"action": ACTION})
        self.buffer = ReplayBuffer.open(self.dir / "buffer", schema)
        self.buffer.append(schema.batch_from_records(rows(2000)))
        self.server = BatchServer(self.buffer, TASKS, InterventionSampler(), token=BATCH_TOKEN)
        self.db = f"sqlite:///{tmp}/meta.db"
        upgrade(self.db)
        self.store = MetadataStore(self.db)
        with self.store.session() as s:
            s.add(Run(id="run-1", algorithm="hg-dagger"))

    def learner(self, *extra: str, token: str | None = BATCH_TOKEN) -> subprocess.Popen[str]:
        cmd = [
            sys.executable,
            "-m",
            "cloud_learner.process",
            *("--run-dir", str(self.dir)),
            *("--batches", self.server.address),
            *extra,
        ]
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        env.pop(TOKEN_ENV, None)
        if token is not None:  # the batch token comes in the environment, as the cloud's
            env[TOKEN_ENV] = token
        return subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def close(self) -> None:
        self.server.close()
        self.buffer.close()
        self.store.close()


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Run_]:
    r = Run_(tmp_path)
    yield r
    r.close()


def _wait_for(predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError("timed out waiting for the learner")


def _kill_after_two_checkpoints(run: Run_) -> None:
    manager = CheckpointManager(run.dir)
    first = run.learner()
    try:

        def progressed() -> bool:
            latest = manager.latest()
            steps = [m["step"] for m in read_metrics(run.dir)]
            at = int(latest.name.removeprefix("step-")) if latest else 10**9
            return len(manager.list()) >= 2 and bool(steps) and steps[-1] >= at + 7

        _wait_for(progressed, timeout=120)
        os.kill(first.pid, signal.SIGKILL)
    finally:
        first.communicate(timeout=30)
    assert first.returncode == -signal.SIGKILL


@pytest.mark.slow
def test_sigkill_mid_training_then_resume(run: Run_) -> None:
    _kill_after_two_checkpoints(run)
    manager = CheckpointManager(run.dir)
    ckpt = manager.load()
    # Updates logged after the last checkpoint (usually some) are redone after the resume.
    assert max(m["step"] for m in read_metrics(run.dir)) >= ckpt.learner_step
    version_before = WeightDirectory(run.dir / "weights").latest_version()

    target = ckpt.learner_step + 15  # publishes at resume and at +10
    resumed = run.learner("--max-updates", str(target))
    _, err = resumed.communicate(timeout=180)
    assert resumed.returncode == 0, err
    assert f"resumed {manager.directory}/step-{ckpt.learner_step:010d}" in err

    # Parameters continue: the first version published after resume is the checkpoint's policy.
    first_new = run.dir / "weights" / f"v{version_before + 1:08d}.safetensors"
    shipped = load_file(str(first_new))
    for key, value in ckpt.algorithm["policy"].items():
        assert (shipped[key] == value).all(), key
    assert WeightDirectory(run.dir / "weights").latest_version() > version_before + 1
    # Metric steps continue without gap or duplicate, in JSON lines and in TensorBoard (a run's
    # learner logs every 10 updates; the warm start's BC updates log none).
    steps = [m["step"] for m in read_metrics(run.dir)]
    assert steps == list(range(10, target + 1, 10))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run.dir / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("learner/loss")] == steps
    assert manager.load().learner_step == target
    # The run side records every published version and checkpoint in the metadata store, for
    # the dashboard (the learner has no store access); again after a restart, once each.
    VersionRecorder(run.store, "run-1", run.dir).poll()
    VersionRecorder(run.store, "run-1", run.dir).poll()
    with run.store.session() as s:
        versions = sorted(s.scalars(select(PolicyVersion.version)))
        ckpts = list(s.scalars(select(Checkpoint.learner_step)))
        kinds = set(s.scalars(select(Event.kind).where(Event.run_id == "run-1")))
    assert versions == list(range(1, versions[-1] + 1)) and versions[-1] >= version_before + 2
    assert ckpt.learner_step in ckpts and target in ckpts
    assert kinds == {"learner.published", "learner.checkpoint"}


@pytest.mark.slow
def test_a_checkpoint_the_spec_no_longer_fits_is_refused(run: Run_) -> None:
    first = run.learner("--max-updates", "12")
    _, err = first.communicate(timeout=180)
    assert first.returncode == 0, err
    versions = WeightDirectory(run.dir / "weights").latest_version()
    (run.dir / "spec.json").write_text(json.dumps(spec(hidden=64)))
    refused = run.learner()
    _, err = refused.communicate(timeout=120)
    assert refused.returncode == EXIT_REFUSED, err
    assert "learner: refused:" in err and "policy" in err
    assert CheckpointManager(run.dir).load().learner_step == 12  # nothing was overwritten
    # Each tensor that no longer fits, with both shapes and the spec key behind it.
    reason = read_refusal(run.dir)
    assert reason is not None and reason in err
    key = "policy.hidden_sizes: checkpoint has [32, 32], this run has [64, 64]"
    for tensor in (
        "policy.head.0.weight: this run shape (64, 39), checkpoint (32, 39)",
        "policy.head.0.bias: this run shape (64,), checkpoint (32,)",
        "policy.head.2.weight: this run shape (64, 64), checkpoint (32, 32)",
        "policy.head.4.weight: this run shape (4, 64), checkpoint (4, 32)",
    ):
        assert f"{tensor} ({key})" in reason, reason
    assert "policy.head.4.bias" not in reason  # (4,) either way
    assert "policy.hidden: checkpoint has 32, this run has 64" in reason  # the learner's key
    assert WeightDirectory(run.dir / "weights").latest_version() == versions  # none published
    # The refusal is the last start's: a start that is not refused removes it.
    (run.dir / "spec.json").write_text(json.dumps(spec()))
    again = run.learner("--max-updates", "14")
    _, err = again.communicate(timeout=180)
    assert again.returncode == 0, err
    assert read_refusal(run.dir) is None


def test_a_learner_without_the_batch_token_is_refused_by_name(run: Run_) -> None:
    refused = run.learner(token=None)
    _, err = refused.communicate(timeout=120)
    assert refused.returncode == EXIT_REFUSED, err
    reason = read_refusal(run.dir)
    assert reason is not None and TOKEN_ENV in reason
    assert run.server.requests == 0 and run.server.refused == 0  # it never asked


def test_a_spec_without_gpus_trains_on_the_cpu() -> None:
    assert learner_device(0.0) == torch.device("cpu")


def test_a_gpu_the_node_lacks_is_refused_by_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="learner.num_gpus is 1"):
        learner_device(1.0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert learner_device(0.5) == torch.device("cuda")


def test_online_updates_wait_for_min_size_robot_transitions_not_demonstrations(
    tmp_path: Path,
) -> None:
    """``buffer.min_size: 40``: after the warm start on 200 demonstration rows the learner does
    no online update while robots have put 39 transitions in the buffer, then does at 40."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "spec.json").write_text(json.dumps(spec(buffer={"min_size": 40})))
    schema = StepSchema.from_features({"observation.state": STATE}, {"action": ACTION})
    buffer = ReplayBuffer.open(run_dir / "buffer", schema)
    buffer.append(schema.batch_from_records(rows(200, robot_id="demo")))
    server = BatchServer(
        buffer,
        TASKS,
        InterventionSampler(),
        offline_rows=200,
        demonstration_robots=["demo"],
        token=BATCH_TOKEN,
    )
    proc = RunLearner.open(run_dir, server.address, None, token=BATCH_TOKEN)
    bc_updates = proc.params.bc_updates
    stop = threading.Event()
    worker = threading.Thread(target=proc.run, args=(stop.is_set, lambda: False), daemon=True)

    def polls_after_counts_changed() -> None:
        # Every request of a waiting learner is a size poll (at most one a second): once the
        # server has answered two after this point, the learner has judged the new counts.
        seen = server.requests
        _wait_for(lambda: server.requests >= seen + 3, timeout=30)

    try:
        worker.start()
        _wait_for(lambda: proc.learner.version >= 1, timeout=60)  # the warm start is done
        polls_after_counts_changed()
        assert proc.learner.step == bc_updates  # 200 demonstration rows do not count
        buffer.append(schema.batch_from_records(rows(39, episode_steps=39)))
        polls_after_counts_changed()
        assert proc.learner.step == bc_updates  # 39 robot transitions < 40
        buffer.append(schema.batch_from_records(rows(1, first_seq=39, episode_steps=1)))
        _wait_for(lambda: proc.learner.step >= bc_updates + 10, timeout=60)
    finally:
        stop.set()
        worker.join(timeout=60)
        proc.close()
        server.close()
        buffer.close()
    assert not worker.is_alive()
    started = read_metrics(run_dir, prefix="start")
    assert started == [
        {"step": bc_updates, "prefix": "start", "robot_steps": 40.0, "offline_steps": 200.0}
    ]
    logged = read_metrics(run_dir)  # the learner's stats keep robot and offline rows apart
    assert logged and all(m["robot_steps"] == 40.0 and m["offline_steps"] == 200.0 for m in logged)


def test_a_window_without_labelled_rows_is_waited_out_not_a_crash(tmp_path: Path) -> None:
    """HG-DAgger trains on the operator's rows only: once the sampling window (here the
    capacity window; retention deleting segments does the same) holds none, the learner waits
    for the next ones instead of dying with NothingToSample, then trains on them."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "spec.json").write_text(json.dumps(spec()))
    schema = StepSchema.from_features({"observation.state": STATE}, {"action": ACTION})
    buffer = ReplayBuffer.open(run_dir / "buffer", schema, BufferSettings(capacity_transitions=100))
    buffer.append(schema.batch_from_records(rows(200)))  # every other row the operator's
    server = BatchServer(buffer, TASKS, InterventionSampler(), token=BATCH_TOKEN)
    proc = RunLearner.open(run_dir, server.address, None, token=BATCH_TOKEN)
    stop = threading.Event()
    errors: list[BaseException] = []

    def work() -> None:
        try:
            proc.run(stop.is_set, lambda: False)
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=work, daemon=True)
    try:
        worker.start()
        _wait_for(lambda: proc.learner.step >= proc.params.bc_updates + 5, timeout=60)
        autonomous = [{**r, "is_intervention": False} for r in rows(150, first_seq=200)]
        buffer.append(schema.batch_from_records(autonomous))  # the window: no labelled row
        seen = server.requests
        _wait_for(lambda: server.requests >= seen + 20 or not worker.is_alive(), timeout=30)
        assert worker.is_alive() and not errors, errors
        step = proc.learner.step
        buffer.append(schema.batch_from_records(rows(60, first_seq=350)))
        _wait_for(lambda: proc.learner.step >= step + 5, timeout=60)
    finally:
        stop.set()
        worker.join(timeout=60)
        proc.close()
        server.close()
        buffer.close()
    assert not errors, errors


def test_a_full_checkpoint_disk_is_waited_out_not_a_crash(run: Run_, tmp_path: Path) -> None:
    """The checkpoint directory's disk fills up: the learner keeps training (no exit, no half
    checkpoint left holding space) and checkpoints again once there is room."""
    from tests.fakes.disk import TmpfsDisk

    disk = TmpfsDisk(run.dir / "checkpoints", size="1m")
    manager = CheckpointManager(run.dir)
    proc = RunLearner.open(run.dir, run.server.address, None, token=BATCH_TOKEN)
    stop = threading.Event()
    errors: list[BaseException] = []

    def work() -> None:
        try:
            proc.run(stop.is_set, lambda: False)
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=work, daemon=True)
    try:
        worker.start()
        _wait_for(lambda: len(manager.list()) >= 1, timeout=60)
        disk.fill()
        step = proc.learner.step
        _wait_for(lambda: proc.learner.step >= step + 60 or not worker.is_alive(), timeout=60)
        assert worker.is_alive() and not errors, errors
        assert not list(manager.directory.glob(".tmp-*"))
        disk.free()
        latest = manager.latest()
        _wait_for(lambda: manager.latest() != latest, timeout=60)
    finally:
        stop.set()
        worker.join(timeout=60)
        proc.close()
        disk.close()
    assert not errors, errors
