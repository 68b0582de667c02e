"""Import a local LeRobotDataset v3 directory into a buffer directory (offline data).

Every column is carried into a robofleet column or refused by name (``ignore_columns`` leaves
one out); the mapping, the success convention and how frames are decoded are in
``docs/lab_data.md``. Nothing is downloaded: a directory without ``meta/info.json`` is refused.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from buffer.config import BufferSettings
from buffer.table.features import FeatureSpec
from buffer.table.schema import StepSchema
from lab_data.importing import ImportJob, Progress

VIDEO_BACKEND = "pyav"

# LeRobot's own bookkeeping columns, each carried into its robofleet column.
_META = ("index", "episode_index", "frame_index", "timestamp", "task_index")
_REWARD, _DONE, _TRUNCATED = "next.reward", "next.done", "next.truncated"
INTERVENTION_COLUMNS = ("is_intervention", "complementary_info.is_intervention")
SUCCESS_COLUMNS = ("next.success", "complementary_info.success")
MAPPED = (
    *_META,
    _REWARD,
    _DONE,
    _TRUNCATED,
    *INTERVENTION_COLUMNS,
    *SUCCESS_COLUMNS,
    "policy_version",
)


@dataclass
class _Plan:
    """What the import reads: the schema, the image/video features and the flag columns."""

    schema: StepSchema
    images: list[str]
    videos: list[str]
    columns: set[str]
    success: str | None
    intervention: list[str] = field(default_factory=list)


def import_lerobot(
    root: str | Path,
    directory: str | Path,
    *,
    repo_id: str | None = None,
    robot_id: str = "lerobot",
    run_id: str | None = None,
    task: str | None = None,
    ignore_columns: Sequence[str] = (),
    settings: BufferSettings | None = None,
    chunk: int = 256,
    progress: Progress | None = None,
) -> Path:
    """Import the LeRobotDataset v3 at ``root`` into a new buffer directory.

    Args:
        root: the dataset directory (``meta/info.json``, ``data/``, ``videos/``).
        directory: the buffer directory to create (mount it with ``ReplayBuffer.mount``).
        repo_id: LeRobot's dataset id (default ``local/<root's name>``; nothing is fetched).
        robot_id: the ``robot_id`` of every step.
        run_id: the ``run_id`` of every step (default ``import:<repo_id>``).
        task: store every step under this task name instead of the dataset's task strings
            (a run's tasks are names such as ``pick-cube``, LeRobot's are sentences).
        ignore_columns: dataset columns to leave out instead of refusing them.
        settings: the new buffer's settings.
        chunk: frames per append (each append is one fdatasync).
        progress: called as ``progress(frames_done, frames_total)`` after each chunk.

    Returns:
        ``directory``.

    Raises:
        ValueError: ``root`` is no LeRobotDataset v3 directory, has no ``action`` or no
            ``observation.*`` feature, or has a column robofleet cannot carry (named).
    """
    from buffer.table.replay_buffer import ReplayBuffer

    ds = open_dataset(root, repo_id)
    plan = _plan(ds.meta.features, set(ignore_columns))
    run_id = run_id or f"import:{ds.meta.repo_id}"
    table = ds.hf_dataset.with_format("arrow")[:]
    task_names = _task_names(ds, task)
    total = table.num_rows
    out = ReplayBuffer.open(directory, plan.schema, settings or BufferSettings())
    try:
        done = 0
        for a, b in _chunks(table, chunk):
            part = table.slice(a, b - a)
            ids = {"robot_id": robot_id, "run_id": run_id}
            out.append(_batch(ds, plan, part, _is_last(table, a, b), ids, task_names))
            done += b - a
            if progress is not None:
                progress(done, total)
        outcomes = episode_outcomes(table, plan.success)
        out.mark_episodes([(robot_id, run_id, ep, kind) for ep, kind in outcomes.items()])
    finally:
        out.close()
    return Path(directory)


def open_dataset(root: str | Path, repo_id: str | None = None) -> Any:
    """``LeRobotDataset`` of the local directory ``root`` with the pyav video backend.

    Raises:
        ValueError: no ``meta/info.json`` under ``root`` (never fetched from a hub), or a
            codebase version other than v3.
    """
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    root = Path(root)
    info = root / "meta" / "info.json"
    if not info.is_file():
        raise ValueError(f"{root}: not a LeRobotDataset directory (no meta/info.json)")
    version = str(json.loads(info.read_text()).get("codebase_version", ""))
    if not version.startswith("v3"):
        raise ValueError(f"{root}: LeRobotDataset {version or '(no version)'}; v3 is supported")
    return LeRobotDataset(repo_id or f"local/{root.name}", root=root, video_backend=VIDEO_BACKEND)


def _plan(features: dict[str, dict[str, Any]], ignore: set[str]) -> _Plan:
    """The schema and column roles of ``features``; refuses what cannot be carried."""
    obs: dict[str, dict[str, Any]] = {}
    images: list[str] = []
    videos: list[str] = []
    refused: list[str] = []
    for name, spec in features.items():
        if name in ignore or name in MAPPED or name == "action":
            continue
        if not name.startswith("observation."):
            refused.append(name)
            continue
        if spec.get("info", {}).get("video.is_depth_map") or spec["dtype"] == "depth":
            refused.append(f"{name} (a depth map)")
            continue
        if spec["dtype"] in ("image", "video"):
            (videos if spec["dtype"] == "video" else images).append(name)
            spec = {**spec, "dtype": "image", "shape": _hwc(spec)}
        obs[name] = spec
    if refused:
        raise ValueError(
            f"columns robofleet cannot carry: {', '.join(refused)} (it maps "
            f"observation.*, action, {', '.join(MAPPED)}); leave them out with "
            "ignore_columns / --ignore-column"
        )
    if "action" not in features or not obs:
        raise ValueError(f"needs 'action' and observation.* features, has {list(features)}")
    schema = StepSchema.from_features(
        obs, {"action": features["action"]}, require_final_observation=False
    )
    present = set(features) - ignore
    success = next((c for c in SUCCESS_COLUMNS if c in present), None)
    interv = [c for c in INTERVENTION_COLUMNS if c in present]
    return _Plan(schema, images, videos, present, success, interv)


def _hwc(spec: dict[str, Any]) -> tuple[int, ...]:
    """An image feature's shape as HWC (HIL-SERL records ``(C, H, W)`` named so)."""
    shape = tuple(int(d) for d in spec["shape"])
    names = list(spec.get("names") or [])
    chw = names[:1] == ["channels"] or (shape[0] in (1, 3, 4) and shape[-1] not in (1, 3, 4))
    return (shape[1], shape[2], shape[0]) if len(shape) == 3 and chw else shape


def _task_names(ds: Any, task: str | None) -> np.ndarray:
    """Task strings by ``task_index`` (object array), or ``task`` for all."""
    tasks = ds.meta.tasks
    n = int(tasks["task_index"].max()) + 1 if len(tasks) else 1
    out = np.full(n, task or "", dtype=object)
    if task is None:
        for name, row in tasks.iterrows():
            out[int(row["task_index"])] = str(name)
    return out


def _chunks(table: pa.Table, size: int) -> Iterator[tuple[int, int]]:
    """``[a, b)`` row ranges of at most ``size`` rows, none crossing an episode."""
    ep = table.column("episode_index").to_numpy()
    bounds = np.flatnonzero(np.diff(ep) != 0) + 1
    starts = [0, *bounds.tolist()]
    ends = [*bounds.tolist(), len(ep)]
    for s, e in zip(starts, ends, strict=True):
        for a in range(s, e, size):
            yield a, min(a + size, e)


def _is_last(table: pa.Table, a: int, b: int) -> np.ndarray:
    """Which rows of ``[a, b)`` end their episode (the next row is another's, or none)."""
    ep = table.column("episode_index").slice(a, min(b + 1, table.num_rows) - a).to_numpy()
    last = np.ones(b - a, dtype=bool)
    nxt = ep[1 : b - a + 1]
    last[: len(nxt)] = nxt != ep[: len(nxt)]
    return last


def _flag(part: pa.Table, name: str) -> np.ndarray:
    """A bool column of ``part`` (float flags count when > 0.5), all False when absent."""
    if name not in part.column_names:
        return np.zeros(part.num_rows, dtype=bool)
    v = _numpy(part.column(name))
    return v > 0.5 if v.dtype.kind == "f" else v.astype(bool)


def _numpy(col: pa.ChunkedArray) -> np.ndarray:
    """A scalar or shape-(1,) column as a flat numpy array."""
    arr = col.combine_chunks()
    if pa.types.is_fixed_size_list(arr.type) or pa.types.is_list(arr.type):
        arr = arr.flatten()
    return arr.to_numpy(zero_copy_only=False)


def _batch(
    ds: Any,
    plan: _Plan,
    part: pa.Table,
    last: np.ndarray,
    ids: dict[str, str],
    task_names: np.ndarray,
) -> pa.RecordBatch:
    """The step batch of one chunk of one episode, in the buffer's exact Arrow schema."""
    n = part.num_rows
    has = plan.columns
    done = _flag(part, _DONE) | _flag(part, _TRUNCATED)
    trunc = _flag(part, _TRUNCATED) | (last & ~done)
    interv = np.zeros(n, dtype=bool)
    for name in plan.intervention:
        interv |= _flag(part, name)
    zeros = np.zeros(n, dtype=np.int64)
    cols: dict[str, Any] = {
        "seq": _numpy(part.column("index")).astype(np.int64),
        "robot_id": pa.array([ids["robot_id"]] * n, pa.string()),
        "run_id": pa.array([ids["run_id"]] * n, pa.string()),
        "task": pa.array(task_names[_numpy(part.column("task_index"))], pa.string()),
        "episode_index": _numpy(part.column("episode_index")).astype(np.int64),
        "frame_index": _numpy(part.column("frame_index")).astype(np.int64),
        "timestamp": _numpy(part.column("timestamp")).astype(np.float64),
        "reward": (
            _numpy(part.column(_REWARD)).astype(np.float32)
            if _REWARD in has
            else np.zeros(n, dtype=np.float32)
        ),
        "terminated": done & ~trunc,
        "truncated": trunc,
        "is_intervention": interv,
        "policy_version": (
            _numpy(part.column("policy_version")).astype(np.int64)
            if "policy_version" in has
            else zeros
        ),
    }
    frames = _video_frames(ds, plan, part) if plan.videos else {}
    for name, f in plan.schema.payload.items():
        if name in frames:
            cols[name] = _fixed(frames[name], f)
        elif name in plan.images:
            cols[name] = _fixed(_png_frames(ds.root, part.column(name), f), f)
        elif name in part.column_names:
            cols[name] = _fixed(_vectors(part.column(name), f), f)
    schema = plan.schema.arrow_schema
    arrays = []
    for fld in schema:
        v = cols.get(fld.name)
        arrays.append(pa.nulls(n, fld.type) if v is None else pa.array(v, fld.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _fixed(values: np.ndarray, f: FeatureSpec) -> pa.Array:
    """``(n, *f.shape)`` values as the feature's fixed-size list column."""
    flat = np.ascontiguousarray(values, dtype=f.dtype).reshape(-1)
    return pa.FixedSizeListArray.from_arrays(pa.array(flat), f.size)


def _vectors(col: pa.ChunkedArray, f: FeatureSpec) -> np.ndarray:
    """A list column (fixed or variable size) as ``(n, *f.shape)`` of the feature's dtype.

    Raises:
        ValueError: a row has the wrong number of values (names the feature).
    """
    arr = col.combine_chunks()
    flat = arr.flatten().to_numpy(zero_copy_only=False)
    if flat.size != len(arr) * f.size:
        raise ValueError(f"{f.name}: rows do not all hold {f.size} values (shape {f.shape})")
    return flat.reshape(len(arr), *f.shape).astype(f.dtype, copy=False)


def _png_frames(root: Path, col: pa.ChunkedArray, f: FeatureSpec) -> np.ndarray:
    """Decode a LeRobot image column (struct of PNG ``bytes`` / ``path``) to uint8 HWC."""
    from PIL import Image

    arr = col.combine_chunks()
    blobs, paths = arr.field("bytes").to_pylist(), arr.field("path").to_pylist()
    out = np.empty((len(arr), *f.shape), dtype=np.uint8)
    for i, blob in enumerate(blobs):
        data = blob if blob else (Path(root) / str(paths[i])).read_bytes()
        out[i] = np.asarray(Image.open(io.BytesIO(data))).reshape(f.shape)
    return out


def _video_frames(ds: Any, plan: _Plan, part: pa.Table) -> dict[str, np.ndarray]:
    """Decode the chunk's frames of each video feature (one episode) to uint8 HWC, with
    LeRobot's pyav decoder at the frames' timestamps."""
    from lerobot.datasets.video_utils import decode_video_frames

    ep = int(_numpy(part.column("episode_index"))[0])
    ts = _numpy(part.column("timestamp")).astype(np.float64)
    meta = ds.meta.episodes[ep]
    out = {}
    for key in plan.videos:
        start = float(meta[f"videos/{key}/from_timestamp"])
        path = Path(ds.root) / ds.meta.get_video_file_path(ep, key)
        frames = decode_video_frames(
            path, (start + ts).tolist(), ds.tolerance_s, VIDEO_BACKEND, return_uint8=True
        )
        out[key] = frames.permute(0, 2, 3, 1).numpy()  # (n, C, H, W) -> HWC
    return out


def episode_outcomes(table: pa.Table, success_column: str | None) -> dict[int, str]:
    """Each episode's outcome: from ``success_column`` (any frame true), else HIL-SERL's
    sparse-reward convention (its final frame done with ``next.reward > 0``), else none."""
    names = table.column_names
    if success_column is None and _REWARD not in names:
        return {}
    ep = _numpy(table.column("episode_index")).astype(np.int64)
    out: dict[int, str] = {}
    if success_column is not None:
        won = _flag(table, success_column)
        for e in np.unique(ep).tolist():
            out[int(e)] = "success" if won[ep == e].any() else "failure"
        return out
    reward = _numpy(table.column(_REWARD)).astype(np.float64)
    done = _flag(table, _DONE) | _flag(table, _TRUNCATED) if _DONE in names else None
    last = np.append(ep[1:] != ep[:-1], True)
    for i in np.flatnonzero(last).tolist():
        ok = reward[i] > 0 and (done is None or bool(done[i]))
        out[int(ep[i])] = "success" if ok else "failure"
    return out


class LeRobotImporter:
    """LeRobotDataset v3 (``meta/info.json``): every column carried or refused by name."""

    format = "lerobot"
    recognised_by = "meta/info.json (LeRobotDataset v3)"
    options: tuple[str, ...] = ("ignore_columns", "repo_id", "run_id", "chunk")
    keeps_robot_ids = False

    def detect(self, path: Path) -> bool:
        return (path / "meta" / "info.json").is_file()

    def schema(
        self, path: Path, options: Mapping[str, Any], task: str | None
    ) -> tuple[StepSchema, list[str]]:
        """Observation and ``action`` features from ``meta/info.json``, tasks from
        ``meta/tasks.parquet`` (or ``tasks.jsonl``).

        Raises:
            ValueError: no ``action`` feature.
        """
        info = json.loads((path / "meta" / "info.json").read_text())
        feats = {
            k: {"dtype": v["dtype"], "shape": tuple(v["shape"]), "names": v.get("names")}
            for k, v in dict(info.get("features", {})).items()
            if k.startswith("observation.") or k == "action"
        }
        if "action" not in feats:
            raise ValueError(f"{path}: a LeRobot dataset without an 'action' feature")
        action = {"action": feats.pop("action")}
        schema = StepSchema.from_features(feats, action, require_final_observation=False)
        return schema, _dataset_tasks(path / "meta")

    def import_into(self, job: ImportJob) -> Path:
        robot_id = job.robot_id or "lerobot"
        return import_lerobot(
            job.source,
            job.dest,
            robot_id=robot_id,
            task=job.task,
            progress=job.progress,
            **job.options,
        )


def _dataset_tasks(meta: Path) -> list[str]:
    """The task strings of a dataset's ``meta`` directory (v3 parquet or v2 jsonl)."""
    jsonl = meta / "tasks.jsonl"
    parquet = meta / "tasks.parquet"
    if parquet.is_file():
        import pyarrow.parquet as pq

        table = pq.read_table(parquet)
        for col in ("task", "__index_level_0__"):
            if col in table.column_names:
                return [str(t) for t in table.column(col).to_pylist()]
        return []
    if jsonl.is_file():
        return [json.loads(line)["task"] for line in jsonl.read_text().splitlines() if line]
    return []
