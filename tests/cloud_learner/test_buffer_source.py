"""The learner trains from the real replay buffer (buffer.ReplayBuffer) through BufferSource."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from buffer import InterventionSampler, RateLimiter, ReplayBuffer, StepSchema
from cloud_learner.batch import BatchError
from cloud_learner.config import LearnerSettings
from cloud_learner.factory import build_algorithm, model_config
from cloud_learner.loop import Learner
from cloud_learner.publisher import InMemoryWeightPublisher
from cloud_learner.sources import BufferSource


def _schema() -> StepSchema:
    return StepSchema.from_features(
        {
            "observation.state": {"dtype": "float32", "shape": (3,), "names": ["x", "y", "z"]},
            "observation.images.front": {"dtype": "image", "shape": (16, 16, 3)},
        },
        {"action": {"dtype": "float32", "shape": (2,)}},
    )


def _steps(n: int, task: str, robot: str = "robot-0") -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        end = i % 20 == 19
        rec: dict[str, Any] = {
            "seq": i,
            "robot_id": robot,
            "run_id": "run-a",
            "task": task,
            "episode_index": i // 20,
            "frame_index": i % 20,
            "timestamp": i / 10.0,
            "reward": float(end),
            "terminated": end,
            "truncated": False,
            "is_intervention": bool(i % 3 == 0),
            "policy_version": 0,
            "observation.state": rng.normal(size=3).astype(np.float32),
            "observation.images.front": rng.integers(0, 255, (16, 16, 3), dtype=np.uint8),
            "action": rng.uniform(-1, 1, 2).astype(np.float32),
        }
        if end:
            rec["next.observation.state"] = np.zeros(3, np.float32)
            rec["next.observation.images.front"] = np.zeros((16, 16, 3), np.uint8)
        out.append(rec)
    return out


@pytest.mark.parametrize("algorithm", ["hg_dagger", "recap", "sac_rlpd"])
def test_learner_trains_from_the_replay_buffer(tmp_path: Path, algorithm: str) -> None:
    schema = _schema()
    limiter = RateLimiter(
        samples_per_insert=4.0, min_size_to_sample=40, max_sample=16, max_insert=64
    )
    buf = ReplayBuffer.open(tmp_path / "buffer", schema, rate_limiter=limiter)
    try:
        buf.append(schema.batch_from_records(_steps(60, "reach-v3")))
        settings = LearnerSettings.model_validate(
            dict(
                algorithm=algorithm,
                min_transitions=40,
                batch_size=16,
                log_every_updates=1,
                tasks=["reach-v3", "push-v3"],
                checkpoint_every_updates=5,
                policy={
                    "state_dim": 3,
                    "action_dim": 2,
                    "hidden": 16,
                    "num_tasks": 2,
                    "image_keys": ["observation.images.front"],
                    "image_shape": [16, 16],
                },
            )
        )
        sampler = InterventionSampler()
        learner = Learner(
            tmp_path / "run",
            build_algorithm(settings, torch.device("cpu")),
            BufferSource(buf, settings.tasks, sampler=sampler),
            InMemoryWeightPublisher(),
            settings,
            model_config(settings),
        )
        learner.start(resume=False)
        polls = iter(range(100))
        learner.run(should_stop=lambda: next(polls) >= 99, idle_sleep=0.0)
        # The limiter allows about samples_per_insert * inserts sampled rows, no more.
        assert 0 < learner.step * 16 <= 4.0 * 60 + limiter.error_buffer
        assert learner.checkpoints.latest() is not None
        learner.close()
    finally:
        buf.close()


def test_unknown_task_in_the_buffer_is_named(tmp_path: Path) -> None:
    schema = _schema()
    buf = ReplayBuffer.open(tmp_path / "buffer", schema)
    try:
        buf.append(schema.batch_from_records(_steps(40, "pick-v3")))
        source = BufferSource(buf, tasks=["reach-v3", "push-v3"])
        with pytest.raises(BatchError, match=r"\['pick-v3'\] are not in the run's task list"):
            source.sample(8)
    finally:
        buf.close()


def test_rate_limiter_counters_resume_with_the_rows_gained_meanwhile(tmp_path: Path) -> None:
    schema = _schema()

    def limiter() -> RateLimiter:
        return RateLimiter(samples_per_insert=4.0, min_size_to_sample=40, max_sample=16)

    first = limiter()
    buf = ReplayBuffer.open(tmp_path / "buffer", schema, rate_limiter=first)
    try:
        buf.append(schema.batch_from_records(_steps(60, "reach-v3")))
        source = BufferSource(buf, ["reach-v3"])
        source.sample(16)
        source.sample(16)
        state = source.sampler_state()  # what the learner's checkpoint stores
        assert state["rate_limiter"] == {"inserts": 60, "samples": 32, "buffer_rows": 60}
    finally:
        buf.close()
    # The learner was down while the robots uploaded 20 more rows.
    second = limiter()
    buf = ReplayBuffer.open(tmp_path / "buffer", schema, rate_limiter=second)
    try:
        more = _steps(80, "reach-v3")[60:]
        buf.append(schema.batch_from_records(more))
        source = BufferSource(buf, ["reach-v3"])
        assert not source.can_sample(16)  # a fresh limiter: 20 < min_size_to_sample
        source.load_sampler_state(state)
        assert second.state_dict() == {"inserts": 80, "samples": 32}
        assert source.can_sample(16)
    finally:
        buf.close()
