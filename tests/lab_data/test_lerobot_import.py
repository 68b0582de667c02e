"""Import of LeRobotDataset v3 directories made with LeRobot's own API: every column carried
or refused by name, images bit-exact, interventions and outcomes intact."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from buffer import ReplayBuffer
from foundation.rows import RowFilter
from lab_data import import_lerobot
from tests.lab_data.lerobot_data import HIL_LENGTHS, hil_serl_dataset

pytestmark = pytest.mark.slow


def test_hil_serl_dataset_imports_every_column(tmp_path, caplog) -> None:
    made = hil_serl_dataset(tmp_path / "ds")
    n = sum(HIL_LENGTHS)
    with pytest.raises(ValueError, match=r"complementary_info\.discrete_penalty"):
        import_lerobot(tmp_path / "ds", tmp_path / "refused")
    assert not (tmp_path / "refused").exists()
    seen: list[tuple[int, int]] = []
    caplog.set_level(logging.INFO)
    out = import_lerobot(
        tmp_path / "ds",
        tmp_path / "buf",
        ignore_columns=["complementary_info.discrete_penalty"],
        chunk=4,
        progress=lambda done, total: seen.append((done, total)),
    )
    assert "torchcodec" not in caplog.text  # the video backend is chosen, never probed
    assert seen[-1] == (n, n) and len(seen) == 5  # chunks never cross an episode
    with ReplayBuffer.open(out, read_only=True) as buf:
        assert buf.num_steps == n
        got = buf.read_transitions(np.arange(n))
        c = buf.index.cols
        np.testing.assert_array_equal(got["observation.images.front"], made["image"])
        np.testing.assert_array_equal(got["observation.state"], made["state"])
        np.testing.assert_array_equal(got["action"], made["action"])
        np.testing.assert_array_equal(got["reward"], made["reward"][:, 0])
        np.testing.assert_array_equal(c["is_intervention"][:n], made["intervention"][:, 0] > 0)
        assert int(c["is_intervention"][:n].sum()) == 5
        assert c["episode_index"][:n].tolist() == made["episode"]
        assert c["frame_index"][:n].tolist() == [i for k in HIL_LENGTHS for i in range(k)]
        np.testing.assert_allclose(c["timestamp"][:n], c["frame_index"][:n] / 10, atol=1e-6)
        assert c["seq"][:n].tolist() == list(range(n))
        assert list(got["task"]) == made["task"]
        ends = np.cumsum(HIL_LENGTHS) - 1
        assert c["terminated"][ends].tolist() == [True, True, False]
        assert c["truncated"][ends].tolist() == [False, False, True]  # recording stopped
        assert not (c["terminated"] | c["truncated"])[:n][np.setdiff1d(np.arange(n), ends)].any()
        # HIL-SERL's sparse reward: episode 0 ended done with reward 1, the rest did not.
        assert buf.index.outcomes == {
            ("import:local/ds", "lerobot", 0): "success",
            ("import:local/ds", "lerobot", 1): "failure",
            ("import:local/ds", "lerobot", 2): "failure",
        }
        won = buf.select(RowFilter(success_only=True))
        assert set(c["episode_index"][won].tolist()) == {0}


def test_task_override_and_bad_directories(tmp_path) -> None:
    hil_serl_dataset(tmp_path / "ds", lengths=(3, 3), penalty=False)
    out = import_lerobot(tmp_path / "ds", tmp_path / "buf", task="pick-cube", robot_id="so101")
    with ReplayBuffer.open(out, read_only=True) as buf:
        assert buf.index.tasks.names == ["pick-cube"]
        assert buf.index.robots.names == ["so101"]
        assert buf.index_summary()["interventions"] == 2
    with pytest.raises(ValueError, match="no meta/info.json"):
        import_lerobot(tmp_path / "nothing", tmp_path / "b2")


def test_video_dataset_with_success_column_and_chw_cameras(tmp_path, caplog) -> None:
    """HIL-SERL's recorder writes cameras as CHW video; LeRobot's evaluation writes
    ``next.success``. Frames decode through pyav (lossy: compared with a tolerance)."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    chw = (3, 32, 32)
    features = {
        "observation.state": {"dtype": "float32", "shape": (2,), "names": None},
        "observation.images.wrist": {
            "dtype": "video",
            "shape": chw,
            "names": ["channels", "height", "width"],
        },
        "action": {"dtype": "float32", "shape": (2,), "names": None},
        "is_intervention": {"dtype": "bool", "shape": (1,), "names": None},
        "next.success": {"dtype": "bool", "shape": (1,), "names": None},
    }
    ds = LeRobotDataset.create(
        "local/vid", 10, features, root=tmp_path / "ds", video_backend="pyav"
    )
    frames = []
    for e in range(2):
        for i in range(5):
            img = np.zeros(chw, np.uint8)
            img[:, :, :] = 30 * i + 100 * e  # flat colours survive the codec closely
            frames.append(img.transpose(1, 2, 0))
            ds.add_frame(
                {
                    "observation.state": np.full(2, i, np.float32),
                    "observation.images.wrist": img,
                    "action": np.zeros(2, np.float32),
                    "is_intervention": np.array([i == 2]),
                    "next.success": np.array([e == 1 and i == 4]),
                    "task": "wipe",
                }
            )
        ds.save_episode()
    ds.finalize()
    caplog.set_level(logging.INFO)
    out = import_lerobot(tmp_path / "ds", tmp_path / "buf")
    assert "torchcodec" not in caplog.text
    with ReplayBuffer.open(out, read_only=True) as buf:
        assert buf.schema.observations["observation.images.wrist"].shape == (32, 32, 3)
        got = buf.read_transitions(np.arange(10))["observation.images.wrist"]
        diff = np.abs(got.astype(int) - np.stack(frames).astype(int))
        assert got.dtype == np.uint8 and diff.mean() < 4, diff.mean()
        assert buf.index.cols["is_intervention"][:10].tolist() == [
            i == 2 for _ in range(2) for i in range(5)
        ]
        assert sorted(buf.index.outcomes.values()) == ["failure", "success"]
        assert set(buf.index.cols["episode_index"][buf.select(RowFilter(success_only=True))]) == {1}
