"""Small LeRobotDataset v3 directories made with LeRobot's own recording API, for tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

HIL_LENGTHS = (6, 5, 4)


def hil_serl_dataset(
    root: Path,
    *,
    image: tuple[int, int, int] = (8, 6, 3),
    lengths: tuple[int, ...] = HIL_LENGTHS,
    seed: int = 0,
    penalty: bool = True,
) -> dict[str, Any]:
    """A dataset shaped like LeRobot's HIL-SERL recorder's (``gym_manipulator``): PNG camera
    frames, ``next.reward``, ``next.done``, ``complementary_info.is_intervention`` (float32)
    and ``complementary_info.discrete_penalty``. Episode 0 ends done with reward 1
    (success), episode 1 done with reward 0, the last one stops without a done flag.

    Returns:
        What was written, per frame in dataset order: ``state``, ``image``, ``action``,
        ``reward``, ``done``, ``intervention`` arrays, ``episode`` and ``task`` lists.
    """
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    features: dict[str, Any] = {
        "observation.state": {"dtype": "float32", "shape": (3,), "names": None},
        "observation.images.front": {
            "dtype": "image",
            "shape": image,
            "names": ["height", "width", "channels"],
        },
        "action": {"dtype": "float32", "shape": (2,), "names": None},
        "next.reward": {"dtype": "float32", "shape": (1,), "names": None},
        "next.done": {"dtype": "bool", "shape": (1,), "names": None},
        "complementary_info.is_intervention": {"dtype": "float32", "shape": (1,), "names": None},
    }
    if penalty:
        features["complementary_info.discrete_penalty"] = {
            "dtype": "float32",
            "shape": (1,),
            "names": ["discrete_penalty"],
        }
    ds = LeRobotDataset.create(
        "local/hil", 10, features, root=root, use_videos=False, video_backend="pyav"
    )
    rng = np.random.default_rng(seed)
    rec: dict[str, list[Any]] = {
        k: [] for k in ("state", "image", "action", "reward", "done", "intervention")
    }
    rec["episode"], rec["task"] = [], []
    for e, n in enumerate(lengths):
        task = "pick the cube" if e != 1 else "push the cube"
        for i in range(n):
            end = i == n - 1
            frame = {
                "observation.state": rng.random(3, dtype=np.float32),
                "observation.images.front": rng.integers(0, 256, image, dtype=np.uint8),
                "action": rng.random(2, dtype=np.float32),
                "next.reward": np.array([1.0 if (end and e == 0) else 0.0], np.float32),
                "next.done": np.array([end and e < len(lengths) - 1]),
                "complementary_info.is_intervention": np.array([float(i % 3 == 1)], np.float32),
                "task": task,
            }
            if penalty:
                frame["complementary_info.discrete_penalty"] = np.zeros(1, np.float32)
            ds.add_frame(frame)
            for key, col in (
                ("state", "observation.state"),
                ("image", "observation.images.front"),
                ("action", "action"),
                ("reward", "next.reward"),
                ("done", "next.done"),
                ("intervention", "complementary_info.is_intervention"),
            ):
                rec[key].append(frame[col])
            rec["episode"].append(e)
            rec["task"].append(task)
        ds.save_episode()
    ds.finalize()
    out: dict[str, Any] = {k: np.stack(v) for k, v in rec.items() if k not in ("episode", "task")}
    out["episode"], out["task"] = rec["episode"], rec["task"]
    return out
