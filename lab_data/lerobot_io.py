"""Interchange with LeRobotDataset v3, through the lerobot library.

Export writes any selection of a buffer as a LeRobotDataset v3 directory with
``LeRobotDataset.create`` / ``add_frame`` / ``save_episode`` / ``finalize``. Each contiguous run
of one robot's episode becomes one LeRobot episode, renumbered so ``frame_index`` starts at 0
and ``timestamp == frame_index / fps`` (LeRobot computes both). Extra features carry what
LeRobot has no field for: ``next.reward`` (float32), ``next.done`` (terminated or truncated),
``next.truncated``, ``is_intervention`` (bool) and ``policy_version`` (int64), each shape (1,).

Images are stored as PNG (lossless: bit-exact uint8) by default; ``use_videos=True`` encodes
MP4 video instead, which is lossy (compare with a tolerance). Not representable in the format:
a done step's real final observation (LeRobot has no frame for it) and the policy/operator
action proposals; on import a done step's final observation repeats its own observation.

Import (:func:`import_lerobot`, in ``lab_data.lerobot_import``) reads a local LeRobotDataset
(``root``; nothing is downloaded) into a buffer directory whose rows can then be mounted as
offline data; every column it carries or refuses is listed there.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from buffer.table.schema import StepSchema
from foundation.rows import RowFilter
from lab_data.importing import Progress
from lab_data.lerobot_import import VIDEO_BACKEND, import_lerobot

if TYPE_CHECKING:
    from buffer.table.replay_buffer import ReplayBuffer

__all__ = ["export_lerobot", "import_lerobot"]

EXTRA_FEATURES: dict[str, dict[str, Any]] = {
    "next.reward": {"dtype": "float32", "shape": (1,), "names": None},
    "next.done": {"dtype": "bool", "shape": (1,), "names": None},
    "next.truncated": {"dtype": "bool", "shape": (1,), "names": None},
    "is_intervention": {"dtype": "bool", "shape": (1,), "names": None},
    "policy_version": {"dtype": "int64", "shape": (1,), "names": None},
}


def _episode_runs(buf: ReplayBuffer, rows: np.ndarray) -> list[np.ndarray]:
    """Split rows into runs of consecutive frames of one (run, robot, episode)."""
    idx = buf.index
    li = rows - idx.base
    key = np.stack(
        [idx.cols["run"][li], idx.cols["robot"][li], idx.cols["episode_index"][li]], axis=1
    )
    order = np.lexsort((idx.cols["frame_index"][li], key[:, 2], key[:, 1], key[:, 0]))
    rows, key, fr = rows[order], key[order], idx.cols["frame_index"][li][order]
    brk = np.flatnonzero((np.diff(key, axis=0) != 0).any(axis=1) | (np.diff(fr) != 1)) + 1
    return [r for r in np.split(rows, brk) if len(r)]


def export_lerobot(
    buf: ReplayBuffer,
    root: str | Path,
    repo_id: str,
    fps: int,
    *,
    rows: np.ndarray | None = None,
    use_videos: bool = False,
    robot_type: str | None = None,
    progress: Progress | None = None,
    keep: RowFilter | None = None,
) -> Path:
    """Export steps of ``buf`` to a new LeRobotDataset v3 at ``root``.

    Args:
        buf: the buffer to read.
        root: target directory (must not exist yet).
        repo_id: dataset id written into its metadata (nothing is uploaded).
        fps: frames per second of the recording (timestamps are ``frame_index / fps``).
        rows: global rows to export; default every stored step ``keep`` keeps, but those
            of episodes an operator discarded (``ReplayBuffer.mark_episode``).
        use_videos: encode cameras as MP4 (lossy) instead of PNG frames (bit-exact).
        progress: called as ``progress(frames_done, frames_total)`` after each episode.
        keep: which stored steps to export when ``rows`` is None (default all).

    A buffer with episode outcomes (``success`` marks) also gets ``next.success``: True on
    the last frame of each successful episode (what ``import_lerobot`` reads back).

    Returns:
        ``root``. Load it with ``LeRobotDataset(repo_id, root=root)``.

    Raises:
        ValueError: the selection is empty.
    """
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    root = Path(root)
    if rows is None:
        idx = buf.index
        a, b = buf.first_row - idx.base, buf.visible - idx.base
        mask = ~idx.cols["discarded"][a:b]
        if keep is not None:
            mask &= idx.matches(a, b, keep)
        rows = np.flatnonzero(mask).astype(np.int64) + a + idx.base
    if len(rows) == 0:
        raise ValueError("nothing to export: the selection is empty")
    features = _lerobot_features(buf.schema, use_videos)
    with_success = bool(buf.index.outcomes)
    if with_success:
        features["next.success"] = {"dtype": "bool", "shape": (1,), "names": None}
    ds = LeRobotDataset.create(
        repo_id,
        fps,
        features,
        root=root,
        robot_type=robot_type,
        use_videos=use_videos,
        video_backend=VIDEO_BACKEND,
    )
    done, total = 0, len(rows)
    for run in _episode_runs(buf, np.asarray(rows, dtype=np.int64)):
        _add_episode(ds, buf, run, with_success)
        done += len(run)
        if progress is not None:
            progress(done, total)
    ds.finalize()
    images = root / "images"  # LeRobot's staging folder for PNG frames, empty by now
    if images.is_dir() and not any(p.is_file() for p in images.rglob("*")):
        shutil.rmtree(images)
    return root


def _lerobot_features(schema: StepSchema, use_videos: bool) -> dict[str, Any]:
    """LeRobot feature specs of the schema's observations and action, plus the flags."""
    features: dict[str, Any] = {}
    for name, f in schema.observations.items():
        spec = f.to_lerobot()
        if f.is_image and use_videos:
            spec["dtype"] = "video"
        features[name] = spec
    features["action"] = schema.action.to_lerobot()
    features.update(EXTRA_FEATURES)
    return features


def _add_episode(ds: Any, buf: ReplayBuffer, run: np.ndarray, with_success: bool) -> None:
    """Frames of one run of consecutive rows of an episode, saved as one episode."""
    idx = buf.index
    tasks = np.asarray(idx.tasks.names, dtype=object)
    obs_names = list(buf.schema.observations)
    data = buf.storage.gather(run, [*obs_names, "action"], count=False)
    li = run - idx.base
    c = idx.cols
    won = with_success and bool(idx.success_mask(int(li[0]), int(li[0]) + 1)[0])
    for i in range(len(run)):
        j = li[i]
        frame: dict[str, Any] = {k: data[k][i] for k in (*obs_names, "action")}
        frame["next.reward"] = np.array([c["reward"][j]], dtype=np.float32)
        frame["next.done"] = np.array([c["terminated"][j] or c["truncated"][j]])
        frame["next.truncated"] = np.array([c["truncated"][j]])
        frame["is_intervention"] = np.array([c["is_intervention"][j]])
        frame["policy_version"] = np.array([c["policy_version"][j]], dtype=np.int64)
        if with_success:
            frame["next.success"] = np.array([won and i == len(run) - 1])
        frame["task"] = str(tasks[c["task"][j]])
        ds.add_frame(frame)
    ds.save_episode()
