"""LeRobotDataset v3 export and import through the lerobot library."""

from __future__ import annotations

import numpy as np
import pytest

from buffer import ReplayBuffer
from foundation.rows import RowFilter
from lab_data import export_lerobot, import_lerobot
from tests.buffer.helpers import episodes, open_buffer, small_schema, step

IMG = (12, 10, 3)


@pytest.mark.slow
def test_export_loads_unchanged_and_round_trips(tmp_path) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    rng = np.random.default_rng(0)
    recs = episodes(0, [6, 4], image=IMG, intervention=True) + episodes(
        1, [5], seq0=0, image=IMG, task="push"
    )
    for r in recs:  # random pixels: bit-exactness must not be luck
        r["observation.images.front"] = rng.integers(0, 256, IMG, dtype=np.uint8)
    fps = 10
    with open_buffer(tmp_path / "b", small_schema(image=IMG)) as buf:
        buf.append(recs)
        root = export_lerobot(buf, tmp_path / "lr", "local/rt", fps)
        src = buf.read_transitions(np.arange(buf.visible))
    ds = LeRobotDataset("local/rt", root=root)
    assert ds.meta.total_episodes == 3 and len(ds) == 15
    hf = ds.hf_dataset.with_format("numpy")
    ts = np.asarray(hf["timestamp"]).reshape(-1)
    fr = np.asarray(hf["frame_index"]).reshape(-1)
    np.testing.assert_allclose(ts, fr / fps, atol=1e-6)
    assert (fr[np.asarray(hf["episode_index"]).reshape(-1) == 1] == np.arange(4)).all()
    item = ds[0]
    assert tuple(item["observation.images.front"].shape) == (3, 12, 10)  # torch CHW float

    with ReplayBuffer.open(import_lerobot(root, tmp_path / "imp", repo_id="local/rt")) as imp:
        got = imp.read_transitions(np.arange(imp.visible))
    order = np.lexsort((src["frame_index"], src["episode_index"], src["robot_id"]))
    # Export order is by (run, robot, episode, frame); compare in that order.
    for key in (
        "observation.images.front",
        "observation.state",
        "action",
        "reward",
        "terminated",
        "truncated",
        "is_intervention",
        "frame_index",
    ):
        np.testing.assert_array_equal(got[key], src[key][order], err_msg=key)
    assert list(got["task"]) == list(src["task"][order])


@pytest.mark.slow
def test_export_selection_renumbers_frames(tmp_path) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    recs = [
        step(0, i, 0, i, image=IMG, intervention=i in (2, 3, 4), terminated=i == 7)
        for i in range(8)
    ]
    with open_buffer(tmp_path / "b", small_schema(image=IMG)) as buf:
        buf.append(recs)
        export_lerobot(
            buf, tmp_path / "lr", "local/sel", 5, keep=RowFilter(interventions_only=True)
        )
        with pytest.raises(ValueError, match="empty"):
            export_lerobot(buf, tmp_path / "none", "local/n", 5, keep=RowFilter(tasks=("nope",)))
    ds = LeRobotDataset("local/sel", root=tmp_path / "lr")
    hf = ds.hf_dataset.with_format("numpy")
    assert np.asarray(hf["frame_index"]).reshape(-1).tolist() == [0, 1, 2]
    np.testing.assert_allclose(np.asarray(hf["timestamp"]).reshape(-1), [0, 0.2, 0.4], atol=1e-6)
    assert np.asarray(hf["is_intervention"]).all()


@pytest.mark.slow
def test_export_iterates_in_a_dataloader_with_flags_and_images_intact(tmp_path) -> None:
    """A run's export loads with LeRobotDataset and a torch DataLoader (batches of 4): PNG
    frames bit-exact, interventions, rewards, done flags and outcomes intact, timestamps reset
    per episode and equal to frame_index / fps."""
    import torch
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    rng = np.random.default_rng(3)
    recs = episodes(0, [5, 3], image=IMG, intervention=True) + episodes(
        1, [6], seq0=0, image=IMG, task="push"
    )
    for i, r in enumerate(recs):
        r["observation.images.front"] = rng.integers(0, 256, IMG, dtype=np.uint8)
        r["is_intervention"] = i % 3 == 0
    fps = 20
    with open_buffer(tmp_path / "b", small_schema(image=IMG)) as buf:
        buf.append(recs)
        buf.mark_episode("robot-1", "run-a", 0, "success")
        root = export_lerobot(buf, tmp_path / "lr", "local/dl", fps)
        src = buf.read_transitions(np.arange(buf.visible))
    order = np.lexsort((src["frame_index"], src["episode_index"], src["robot_id"]))
    ds = LeRobotDataset("local/dl", root=root, video_backend="pyav")
    got: dict[str, list[np.ndarray]] = {}
    for batch in torch.utils.data.DataLoader(ds, batch_size=4, shuffle=False):
        assert len(batch["index"]) <= 4
        for key in (
            "observation.images.front",
            "next.reward",
            "next.done",
            "is_intervention",
            "next.success",
            "timestamp",
            "frame_index",
            "episode_index",
        ):
            got.setdefault(key, []).append(batch[key].numpy())
    cat = {k: np.concatenate(v) for k, v in got.items()}
    assert len(cat["timestamp"]) == 14
    images = np.round(cat["observation.images.front"] * 255).astype(np.uint8).transpose(0, 2, 3, 1)
    np.testing.assert_array_equal(images, src["observation.images.front"][order])
    np.testing.assert_array_equal(cat["next.reward"].reshape(-1), src["reward"][order])
    done = (src["terminated"] | src["truncated"])[order]
    np.testing.assert_array_equal(cat["next.done"].reshape(-1), done)
    np.testing.assert_array_equal(cat["is_intervention"].reshape(-1), src["is_intervention"][order])
    frame = cat["frame_index"].reshape(-1)
    np.testing.assert_allclose(cat["timestamp"].reshape(-1), frame / fps, atol=1e-6)
    starts = np.flatnonzero(np.diff(cat["episode_index"].reshape(-1), prepend=-1) != 0)
    assert frame[starts].tolist() == [0, 0, 0]  # each episode's clock starts at 0
    # Robot 1's episode (exported last) succeeded: next.success on its final frame only.
    assert np.flatnonzero(cat["next.success"].reshape(-1)).tolist() == [13]
