"""The buffer's batch server draws what each algorithm needs from a real replay buffer, over
ZeroMQ: HG-DAgger's operator steps, RECAP's every step with success flags, SAC/RLPD's symmetric
operator/autonomous halves, with rewards scaled on the learner's side."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from buffer import InterventionSampler, ReplayBuffer, StepSchema
from buffer.service.batches import BatchServer, RemoteBuffer
from cloud_learner.sources import TransitionBatchSource
from foundation.contracts import TransitionSource
from hal.drivers.metaworld import MetaWorldDriver
from tests.buffer.helpers import BATCH_TOKEN
from tests.runs.helpers import algorithm_sampler

TASKS = ["reach-v3", "push-v3"]


def episode(
    robot: str,
    index: int,
    steps: int,
    *,
    interventions: int = 0,
    end: str = "truncated",
    task: str = "reach-v3",
) -> list[dict[str, Any]]:
    """``steps`` rows; the first ``interventions`` by the operator; reward = frame_index."""
    rows = []
    for frame in range(steps):
        last = frame == steps - 1
        row: dict[str, Any] = {
            "robot_id": robot,
            "run_id": "r",
            "task": task,
            "episode_index": index,
            "frame_index": frame,
            "timestamp": frame / 20,
            "reward": float(frame),
            "terminated": last and end == "terminated",
            "truncated": last and end == "truncated",
            "is_intervention": frame < interventions,
            "policy_version": 1,
            "action": np.full(4, 0.1, np.float32),
            "observation.state": np.full(39, frame, np.float32),
        }
        if last:
            row["next.observation.state"] = np.full(39, frame + 1, np.float32)
        rows.append(row)
    return rows


@pytest.fixture
def buffer(tmp_path: Path) -> Iterator[ReplayBuffer]:
    driver = MetaWorldDriver("schema", tasks=TASKS)
    schema = StepSchema.from_features(driver.observation_features, driver.action_features)
    buf = ReplayBuffer.open(tmp_path / "buffer", schema)
    records = (
        episode("demo", 0, 10, interventions=10)  # a demonstration: truncated, a success
        + episode("robot-1", 1, 20, interventions=5, end="terminated")  # solved
        + episode("robot-1", 2, 30, interventions=5, task="push-v3")  # ran out of time
    )
    for seq, rec in enumerate(records):
        rec["seq"] = seq
    buf.append(schema.batch_from_records(records))
    yield buf
    buf.close()


@pytest.fixture
def server(buffer: ReplayBuffer) -> Iterator[BatchServer]:
    """HG-DAgger's batch server."""
    srv = algorithm_server(buffer, "hg-dagger")
    yield srv
    srv.close()


def algorithm_server(buffer: ReplayBuffer, algorithm: str, **spec_buffer: Any) -> BatchServer:
    """The batch server a run of ``algorithm`` builds: its builder's sampler."""
    sampler = algorithm_sampler(algorithm, **spec_buffer)
    return BatchServer(buffer, TASKS, sampler, demonstration_robots=["demo"], token=BATCH_TOKEN)


def source(server: BatchServer, **kwargs: Any) -> RemoteBuffer:
    return RemoteBuffer(server.address, timeout_s=10, **kwargs, token=BATCH_TOKEN)


def test_hg_dagger_draws_operator_labels_only(server: BatchServer) -> None:
    src = source(server)
    try:
        batch = src.sample(64)
        assert batch["is_intervention"].all()  # HG-DAgger: operator-labelled steps only
    finally:
        src.close()


@pytest.mark.parametrize(("fraction", "autonomous"), [(0.5, 32), (0.25, 16), (1.0, 64)])
def test_symmetric_sampling_takes_exact_halves(
    buffer: ReplayBuffer, fraction: float, autonomous: int
) -> None:
    server = algorithm_server(buffer, "sac", online_fraction=fraction)
    src = source(server)
    try:
        for _ in range(3):
            batch = src.sample(64)
            assert int((~batch["is_intervention"]).sum()) == autonomous
            assert int(batch["is_intervention"].sum()) == 64 - autonomous
    finally:
        src.close()
        server.close()


def test_symmetric_sampling_without_autonomous_steps_draws_only_operator_steps(
    tmp_path: Path,
) -> None:
    driver = MetaWorldDriver("schema", tasks=TASKS)
    schema = StepSchema.from_features(driver.observation_features, driver.action_features)
    buf = ReplayBuffer.open(tmp_path / "only-demos", schema)
    records = episode("demo", 0, 10, interventions=10)
    for seq, rec in enumerate(records):
        rec["seq"] = seq
    buf.append(schema.batch_from_records(records))
    srv = algorithm_server(buf, "sac", online_fraction=0.5)
    src = source(srv)
    try:
        assert src.sample(32)["is_intervention"].all()
    finally:
        src.close()
        srv.close()
        buf.close()


def test_uniform_batches_carry_success_demonstration_flags_and_next_states(
    buffer: ReplayBuffer,
) -> None:
    server = algorithm_server(buffer, "recap")  # every step alike
    src = source(server)
    try:
        b = src.sample(1024)  # 60 rows: every one is drawn (miss chance ~1e-7)
    finally:
        src.close()
        server.close()
    assert not b["is_intervention"].all()
    assert b["task_index"].tolist().count(1) > 0  # push-v3 rows map to index 1
    key = set(zip(b["episode_index"].tolist(), b["frame_index"].tolist(), strict=True))
    assert len(key) == 60
    ends = {
        int(e): bool(s)
        for e, s, t, r in zip(
            b["episode_index"], b["success"], b["terminated"], b["truncated"], strict=True
        )
        if t or r
    }
    assert ends == {0: True, 1: True, 2: False}  # demo: success; solved; ran out of time
    assert not b["success"][~(b["terminated"] | b["truncated"])].any()
    assert b["is_demonstration"].tolist() == (b["episode_index"] == 0).tolist()
    # next.observation.state is the true successor (state = frame index here).
    np.testing.assert_array_equal(
        b["next.observation.state"][:, 0], b["observation.state"][:, 0] + 1
    )


def test_reward_scale_is_applied_on_the_learner_side(buffer: ReplayBuffer) -> None:
    server = algorithm_server(buffer, "recap")
    remote = source(server)
    assert isinstance(remote, TransitionSource)
    src = TransitionBatchSource(remote, reward_scale=0.1)
    try:
        b = src.sample_numpy(128)
        t = src.sample(128)
    finally:
        remote.close()
        server.close()
    np.testing.assert_allclose(b["reward"], 0.1 * b["frame_index"].astype(np.float32), rtol=1e-6)
    torch.testing.assert_close(t["reward"], 0.1 * t["frame_index"].float())
    assert src.num_transitions() == 60 and src.online_transitions() == 60


def test_without_demonstration_robots_nothing_is_a_demonstration(buffer: ReplayBuffer) -> None:
    """The server knows the run's demonstration convention only from its arguments."""
    srv = BatchServer(buffer, TASKS, token=BATCH_TOKEN)
    src = source(srv)
    try:
        b = src.sample(1024)
    finally:
        src.close()
        srv.close()
    assert not b["is_demonstration"].any()
    np.testing.assert_array_equal(b["success"], b["terminated"])  # demo ends truncated


def test_a_camera_the_buffer_lacks_is_refused_by_name_and_the_server_keeps_serving(
    buffer: ReplayBuffer,
) -> None:
    server = algorithm_server(buffer, "sac", online_fraction=0.5)
    bad = source(server, layout={"images": ["observation.images.bogus"]})
    try:
        with pytest.raises(RuntimeError, match="bogus"):
            bad.sample(8)
    finally:
        bad.close()
    good = source(server)
    try:
        assert len(good.sample(8)["action"]) == 8
        assert good.sampler_state() == {"sampler": {}}
    finally:
        good.close()
        server.close()


def test_symmetric_sampling_while_robots_keep_appending(buffer: ReplayBuffer) -> None:
    """Appends grow the index under the sampler; every batch still has exact halves."""
    import threading

    from buffer.sampling.samplers import MixSampler
    from buffer.sampling.view import SamplingView

    stop = threading.Event()
    errors: list[BaseException] = []

    def robot() -> None:
        seq, index = 1000, 10
        try:
            while not stop.is_set():
                rows = episode("robot-2", index, 25, interventions=3)
                for rec in rows:
                    rec["seq"] = seq
                    seq += 1
                buffer.append(buffer.schema.batch_from_records(rows))
                index += 1
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    t = threading.Thread(target=robot)
    t.start()
    sampler, rng = MixSampler(0.5, prior="interventions"), np.random.default_rng(0)
    try:
        for _ in range(300):
            n = len(buffer)
            view = SamplingView(buffer, 0, n, [])
            ((_, rows, _),) = sampler.sample_indices(view, 64, rng)
            assert rows.min() >= 0 and rows.max() < n
            flags = buffer.index.cols["is_intervention"][rows - buffer.index.base]
            assert int(flags.sum()) == 32
    finally:
        stop.set()
        t.join()
    assert not errors and len(buffer) > 60


def test_replies_count_online_rows_without_the_demonstrations_and_size_carries_stats(
    buffer: ReplayBuffer,
) -> None:
    """The update-to-data rule counts robots' rows only; a learner waiting for data polls
    ``size``, which still counts as a request (watchdog) and hands over its statistics."""
    srv = BatchServer(buffer, TASKS, InterventionSampler(), offline_rows=10, token=BATCH_TOKEN)
    src = source(srv)
    try:
        assert src.online_transitions() == 50  # 60 rows, 10 of them the demonstration
        assert src.num_transitions() == 60
        assert srv.requests == 1  # the second figure was fresh: no second request
        src.stats = {"learner_step": 7.0}
        src._size_at = float("-inf")  # stale: ask again
        assert src.online_transitions() == 50
        assert srv.requests == 2
        assert srv.learner_stats == {"learner_step": 7.0}
        src.sample(8)
        assert srv.requests == 3
        rows = episode("robot-2", 3, 5)
        for seq, rec in enumerate(rows, start=100):
            rec["seq"] = seq
        buffer.append(buffer.schema.batch_from_records(rows))
        src.sample(8)  # every sample reply refreshes the counts
        assert src._online == 55
    finally:
        src.close()
        srv.close()
