"""The batch service with offline data mounted: each algorithm's batches mix the run's rows
with the mounted rows at the configured online share (or SOP's adaptive per-task share from
the learner's losses), carry camera frames bit-exact and action chunks that stop at episode
ends, and count a dataset's rows as the run task it names."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from buffer import ReplayBuffer, StepSchema
from buffer.service.batches import BatchServer, MixConfig, RemoteBuffer
from cloud_learner.mix_losses import TaskLossWindow, per_row_bc_loss
from cloud_learner.policies import MLPPolicy, PolicySpec
from cloud_learner.sources import TransitionBatchSource
from tests.buffer.helpers import BATCH_TOKEN
from tests.runs.helpers import algorithm_sampler

TASKS = ["reach-v3", "push-v3"]
CAM = "observation.images.corner"
SCHEMA = StepSchema.from_features(
    {
        "observation.state": {"dtype": "float32", "shape": (3,)},
        CAM: {"dtype": "image", "shape": (8, 8, 3)},
    },
    {"action": {"dtype": "float32", "shape": (2,)}},
)


def frame(robot: str, episode: int, step: int) -> np.ndarray:
    """A frame that names where it came from (robot hash, episode, step)."""
    img = np.zeros((8, 8, 3), np.uint8)
    img[0, 0] = [sum(map(ord, robot)) % 256, episode % 256, step % 256]
    return img


def episode(
    robot: str, index: int, steps: int, task: str, *, interventions: int = 0
) -> list[dict[str, Any]]:
    rows = []
    for t in range(steps):
        last = t == steps - 1
        row: dict[str, Any] = {
            "robot_id": robot,
            "run_id": robot,
            "task": task,
            "episode_index": index,
            "frame_index": t,
            "timestamp": float(t),
            "reward": 0.0,
            "terminated": False,
            "truncated": last,
            "is_intervention": t < interventions,
            "policy_version": 1,
            # the action names its step: chunks can be checked against the episode
            "action": np.array([t, index], np.float32),
            "observation.state": np.full(3, t, np.float32),
            CAM: frame(robot, index, t),
        }
        if last:
            row["next.observation.state"] = np.full(3, t + 1, np.float32)
            row["next." + CAM] = frame(robot, index, t + 1)
        rows.append(row)
    return rows


def write(directory: Path, records: list[dict[str, Any]]) -> ReplayBuffer:
    buf = ReplayBuffer.open(directory, SCHEMA)
    for seq, rec in enumerate(records):
        rec["seq"] = seq
    buf.append(SCHEMA.batch_from_records(records))
    return buf


@pytest.fixture
def buffers(tmp_path: Path) -> Iterator[ReplayBuffer]:
    # A dataset recorded elsewhere: task strings that are not the run's, no interventions.
    write(tmp_path / "dataset", episode("teleop", 0, 40, "Reach the ball")).close()
    run = write(
        tmp_path / "run",
        episode("arm-1", 0, 30, "reach-v3", interventions=6)
        + episode("arm-1", 1, 30, "push-v3", interventions=6),
    )
    run.mount(tmp_path / "dataset", name="teleop", as_task="reach-v3")
    yield run
    run.close()


def serve(buf: ReplayBuffer, algorithm: str, mix: MixConfig | None = None) -> BatchServer:
    """The batch server a run of ``algorithm`` builds: its builder's sampler, which reads the
    server's adaptive shares."""
    mix = mix or MixConfig()
    shares: dict[str, float] = {}
    sampler = algorithm_sampler(
        algorithm,
        offline=bool(buf.offline),
        shares=shares,
        online_fraction=mix.online_fraction,
        mix="adaptive" if mix.adaptive else "fixed",
        adaptive={"min_online": mix.min_online, "max_online": mix.max_online},
    )
    return BatchServer(buf, TASKS, sampler, mix=mix, mix_shares=shares, token=BATCH_TOKEN)


def test_hg_dagger_batches_mix_labels_with_the_mounted_rows_at_the_share(
    buffers: ReplayBuffer,
) -> None:
    server = serve(buffers, "hg-dagger", MixConfig(online_fraction=0.25))
    remote = RemoteBuffer(server.address, timeout_s=10, token=BATCH_TOKEN)
    try:
        batch = remote.sample(400)
        offline = batch["is_offline"]
        # A quarter of each draw from the run's operator labels, the rest from the dataset.
        assert offline.mean() == pytest.approx(0.75, abs=0.02)
        assert batch["is_intervention"][~offline].all()
        assert batch["is_demonstration"][offline].all()  # every mounted row is a label
        # The dataset's rows count as the run task its source names.
        assert set(batch["task_index"][offline].tolist()) == {TASKS.index("reach-v3")}
        sizes = remote.num_transitions(), remote.online_transitions()
        assert sizes == (60 + 40, 60)
    finally:
        remote.close()
        server.close()


def test_frames_arrive_bit_exact_and_chunks_stop_at_the_episode_end(
    buffers: ReplayBuffer,
) -> None:
    server = serve(buffers, "recap", MixConfig(online_fraction=0.5))
    how = {"images": [CAM], "next_images": True, "chunk": 5}
    remote = RemoteBuffer(server.address, timeout_s=10, layout=how, token=BATCH_TOKEN)
    try:
        batch = remote.sample(256)
    finally:
        remote.close()
        server.close()
    assert batch[CAM].dtype == np.uint8 and batch[CAM].shape == (256, 8, 8, 3)
    steps = batch["frame_index"]
    # Each frame is the one stored at its row (its pixel names the step)...
    assert np.array_equal(batch[CAM][:, 0, 0, 2], steps % 256)
    # ...and the next frame its successor's.
    assert np.array_equal(batch["next." + CAM][:, 0, 0, 2], (steps + 1) % 256)
    chunk, pad = batch["action_chunk"], batch["action_chunk_is_pad"]
    assert chunk.shape == (256, 5, 2)
    length = np.where(batch["is_offline"], 40, 30)
    for b in range(256):
        real = ~pad[b]
        # The chunk holds the next steps of the same episode, then repeats the last one.
        assert np.array_equal(chunk[b, real, 0], steps[b] + np.arange(real.sum()))
        assert real.sum() == min(5, length[b] - steps[b])
        assert (chunk[b, ~real, 0] == length[b] - 1).all()


def test_adaptive_shares_follow_each_tasks_losses_within_the_range(
    buffers: ReplayBuffer,
) -> None:
    mix = MixConfig(online_fraction=0.5, adaptive=True, min_online=0.2, max_online=0.8)
    server = serve(buffers, "recap", mix)
    remote = RemoteBuffer(server.address, timeout_s=10, token=BATCH_TOKEN)
    try:
        # The policy fits reach's online rows worse than its offline ones: more online rows.
        remote.stats = {"loss_online/reach-v3": 3.0, "loss_offline/reach-v3": 1.0}
        batch = remote.sample(2000)
        assert server.mix_shares == {"reach-v3": 0.75}
        reach = batch["task_index"] == TASKS.index("reach-v3")
        online = ~batch["is_offline"][reach]
        assert online.mean() == pytest.approx(0.75, abs=0.04)
        remote.stats = {"loss_online/reach-v3": 0.0, "loss_offline/reach-v3": 5.0}
        remote.sample(8)
        assert server.mix_shares["reach-v3"] == 0.2  # clipped to min_online
    finally:
        remote.close()
        server.close()


def test_the_learner_measures_each_tasks_loss_on_each_side(buffers: ReplayBuffer) -> None:
    server = serve(buffers, "recap", MixConfig(online_fraction=0.5))
    remote = RemoteBuffer(server.address, timeout_s=10, token=BATCH_TOKEN)
    source = TransitionBatchSource(remote)
    policy = MLPPolicy(PolicySpec(3, 2, num_tasks=2, hidden_sizes=[16, 8]))
    window = TaskLossWindow(TASKS, window=3)
    try:
        for _ in range(5):
            batch = source.sample(128)
            per_row = per_row_bc_loss(policy, batch)
            assert per_row.shape == (128,) and torch.isfinite(per_row).all()
            window.add(batch, per_row)
    finally:
        remote.close()
        server.close()
    stats = window.stats()
    # reach has rows on both sides; push only online rows (the dataset is reach's).
    assert set(stats) == {"loss_online/reach-v3", "loss_offline/reach-v3"}
    assert all(np.isfinite(v) and v > 0 for v in stats.values())


def test_a_task_with_nothing_to_draw_gives_its_share_to_the_others(tmp_path: Path) -> None:
    # push has only autonomous rows: an HG-DAgger batch has no label of it on either side.
    write(tmp_path / "dataset", episode("teleop", 0, 20, "reach-v3")).close()
    run = write(
        tmp_path / "run",
        episode("arm-1", 0, 10, "reach-v3", interventions=4) + episode("arm-1", 1, 10, "push-v3"),
    )
    run.mount(tmp_path / "dataset")
    mix = MixConfig(online_fraction=0.5, adaptive=True)
    server = serve(run, "hg-dagger", mix)
    remote = RemoteBuffer(server.address, timeout_s=10, token=BATCH_TOKEN)
    try:
        batch = remote.sample(64)
        assert len(batch["task_index"]) == 64
        assert (batch["is_intervention"] | batch["is_offline"]).all()
    finally:
        remote.close()
        server.close()
        run.close()


def test_demonstration_episodes_are_counted_and_kept_apart_from_robot_steps(
    tmp_path: Path,
) -> None:
    demo = episode("arm-1", 0, 10, "reach-v3", interventions=10)
    for row in demo:
        row["policy_version"] = 0  # an operator drove it (edge_agent.core.DEMONSTRATION)
    run = write(tmp_path / "run", demo + episode("arm-1", 1, 20, "push-v3", interventions=3))
    server = serve(run, "recap")
    remote = RemoteBuffer(server.address, timeout_s=10, token=BATCH_TOKEN)
    try:
        assert remote.demonstrations() == {"reach-v3": 1}
        assert remote.online_transitions() == 20  # the robot's own steps only
        batch = remote.sample(200)
        demos = batch["episode_index"] == 0
        assert (batch["is_demonstration"] == demos).all()
    finally:
        remote.close()
        server.close()
        run.close()


def test_demonstrations_are_split_evenly_among_the_robots() -> None:
    from runs.assignments import split_demonstrations

    tasks = ["a", "b", "c", "d"]
    shares = [split_demonstrations(tasks, 1, 4, i) for i in range(4)]
    assert shares == [{"a": 1}, {"b": 1}, {"c": 1}, {"d": 1}]  # one task each
    two = [split_demonstrations(tasks, 3, 2, i) for i in range(2)]
    assert [sum(s.values()) for s in two] == [6, 6]
    assert all(two[0].get(t, 0) + two[1].get(t, 0) == 3 for t in tasks)
    assert split_demonstrations(tasks, 1, 4, 5) == {}  # a robot that joined later
