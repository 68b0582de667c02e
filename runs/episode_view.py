"""A run's episodes as the dashboard's viewer shows them, read from its buffers
(``runs.episode_buffers``): the list, one episode's traces, one camera frame, a label.
:class:`RunEpisodes` is the dashboard's ``foundation.contracts.EpisodeSource``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from buffer import ReplayBuffer
from buffer.errors import SegmentGoneError
from buffer.table import episodes as eps
from foundation.contracts import EpisodeMissing, EpisodeRefused, EpisodesUnavailable
from runs.episode_buffers import RunBuffers

READ_TRIES = 3  # a read that races retention is read again


def summaries(bufs: list[ReplayBuffer], run_id: str) -> list[eps.EpisodeSummary]:
    """Every stored episode of ``run_id`` in ``bufs``, newest first (by the robot's clock
    across shards, whose rows are not comparable)."""
    found = [e for b in bufs for e in eps.summaries(b, run_id)]
    if len(bufs) > 1:
        found.sort(key=lambda e: e.last_time, reverse=True)
    return found


def _find(bufs: list[ReplayBuffer], key: tuple[str, str, int]) -> tuple[ReplayBuffer, np.ndarray]:
    for b in bufs:
        rows = eps.episode_rows(b, key)
        if len(rows):
            return b, rows
    raise EpisodeMissing(
        f"run {key[0]!r} stores no step of robot {key[1]}'s episode {key[2]} "
        "(never stored, or retention deleted it)"
    )


def _segments(flags: np.ndarray, frames: np.ndarray) -> list[list[int]]:
    """``[first, last]`` frame indices of each run of consecutive intervention steps."""
    out: list[list[int]] = []
    for i in np.flatnonzero(flags):
        f = int(frames[i])
        if out and flags[i - 1] and f == out[-1][1] + 1:
            out[-1][1] = f
        else:
            out.append([f, f])
    return out


def _flat(values: np.ndarray) -> list[list[float]]:
    rows: list[list[float]] = values.reshape(len(values), -1).astype(np.float64).round(6).tolist()
    return rows


def read_episode(bufs: list[ReplayBuffer], key: tuple[str, str, int]) -> dict[str, Any]:
    """One episode's stored steps in frame order (keys: docs/dashboard.md, "Episodes").

    Raises:
        EpisodeMissing: none of its steps is stored.
        EpisodesUnavailable: retention kept deleting its rows while they were read.
    """
    for attempt in range(READ_TRIES):
        buf, rows = _find(bufs, key)
        obs = buf.schema.observations
        state_names = [k for k, f in obs.items() if not f.is_image]
        action = ["action"] if "action" in buf.schema.payload else []
        try:
            data = eps.read_steps(buf, rows, state_names + action)
            break
        except SegmentGoneError:
            if attempt == READ_TRIES - 1:
                raise EpisodesUnavailable("retention kept deleting this episode's rows") from None
    summary = next((e for e in eps.summaries(buf, key[0]) if e.key == key), None)
    n = len(rows)
    frames = data["frame_index"]
    parts = [data[k].reshape(n, -1) for k in state_names]
    state = np.concatenate(parts, axis=1) if parts else np.zeros((n, 0))
    deleted = int(frames[0])
    return {
        "task": summary.task if summary else "",
        "label": summary.label if summary else "",
        "label_by": summary.label_by if summary else "",
        "steps": n,
        "deleted_steps": deleted,
        "note": (
            f"retention deleted its first {deleted} steps; the rest are shown" if deleted else ""
        ),
        "frame_index": frames.tolist(),
        "timestamp": data["timestamp"].tolist(),
        "state_features": state_names,
        "state": _flat(state),
        "action": _flat(data["action"]) if action else [],
        "is_intervention": data["is_intervention"].tolist(),
        "reward": data["reward"].astype(np.float64).round(6).tolist(),
        "policy_version": data["policy_version"].tolist(),
        "intervention_segments": _segments(data["is_intervention"], frames),
        "cameras": [k for k, f in obs.items() if f.is_image],
    }


def read_frame(
    bufs: list[ReplayBuffer], key: tuple[str, str, int], frame_index: int, camera: str
) -> np.ndarray:
    """Camera ``camera``'s (empty: the first camera's) uint8 pixels (H, W, C) at step
    ``frame_index`` of episode ``key``.

    Raises:
        EpisodeMissing: no such episode, camera or stored frame (retention may have deleted it).
    """
    buf, rows = _find(bufs, key)
    cams = [k for k, f in buf.schema.observations.items() if f.is_image]
    camera = camera or (cams[0] if cams else "")
    spec = buf.schema.observations.get(camera)
    if spec is None or not spec.is_image:
        raise EpisodeMissing(f"the run's steps have no camera {camera!r}")
    with buf.state.lock:
        base, cols = buf.index.frame()
        rows = rows[rows >= base]  # the index drops rows retention deleted (compaction)
        frames = cols["frame_index"][rows - base].copy()
    hit = np.flatnonzero(frames == frame_index)
    if not len(hit):
        raise EpisodeMissing(f"frame {frame_index} of episode {key[2]} is not stored")
    try:
        return eps.read_steps(buf, rows[hit[:1]], [camera])[camera][0]
    except SegmentGoneError:
        raise EpisodeMissing(f"retention deleted frame {frame_index} of episode {key[2]}") from None


def mark(
    buffers: RunBuffers,
    control: object,
    run_dir: Path,
    key: tuple[str, str, int],
    kind: str,
    reason: str,
) -> int:
    """Mark stored episode ``key`` ``kind`` (success, failure, discard) given by ``reason``;
    returns the rows the mark applies to now.

    Raises:
        EpisodeMissing: none of its steps is stored.
        EpisodeRefused: an outcome for an episode discarded (or rerecorded) already.
        BufferHeld, BufferUnreadable: as :meth:`RunBuffers.mark`.
    """
    run_id, robot_id, ep = key
    with buffers.readers(control, run_id, run_dir) as bufs:
        buf, _ = _find(bufs, key)
        with buf.state.lock:
            excluded = buf.index.discards.get(key)
    if excluded is not None and kind != "discard":
        raise EpisodeRefused(f"episode {ep} is marked {excluded}: it stays excluded")
    return buffers.mark(control, run_id, run_dir, (robot_id, ep), kind, reason)


class RunEpisodes:
    """The episodes of runs for the dashboard (``foundation.contracts.EpisodeSource``).

    Args:
        control: the cloud's comms server when the dashboard runs in its process (a run
            live there is read and labelled through its own buffer), else None.
    """

    def __init__(self, control: object = None) -> None:
        self.control = control
        self.buffers = RunBuffers()

    def episodes(self, run_id: str, run_dir: str) -> list[dict[str, Any]]:
        with self.buffers.readers(self.control, run_id, Path(run_dir)) as bufs:
            found = summaries(bufs, run_id)
        return [
            {
                "robot_id": e.key[1],
                "episode_index": e.key[2],
                "task": e.task,
                "steps": e.steps,
                "deleted_steps": e.first_frame,
                "done": e.done,
                "label": e.label,
                "label_by": e.label_by,
                "interventions": e.interventions,
            }
            for e in found
        ]

    def episode(self, run_id: str, run_dir: str, robot_id: str, episode: int) -> dict[str, Any]:
        with self.buffers.readers(self.control, run_id, Path(run_dir)) as bufs:
            return read_episode(bufs, (run_id, robot_id, episode))

    def frame(
        self, run_id: str, run_dir: str, robot_id: str, episode: int, frame: int, camera: str
    ) -> np.ndarray:
        with self.buffers.readers(self.control, run_id, Path(run_dir)) as bufs:
            return read_frame(bufs, (run_id, robot_id, episode), frame, camera)

    def label(
        self, run_id: str, run_dir: str, robot_id: str, episode: int, kind: str, reason: str
    ) -> int:
        key = (run_id, robot_id, episode)
        return mark(self.buffers, self.control, Path(run_dir), key, kind, reason)
