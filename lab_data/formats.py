"""Data a lab already has, into robofleet buffers: detect its format, import it, describe it.

Formats (:func:`detect_format`):

=============  ======================================  ========================================
format         recognised by                           imported with
=============  ======================================  ========================================
``lerobot``    ``meta/info.json`` (LeRobotDataset v3)  ``lab_data.lerobot_io.import_lerobot``
``robofleet``  ``schema.json`` (a buffer directory)    copied (a run mounts one in place)
``ros2``       ``metadata.yaml``, ``*.mcap``,          ``lab_data.ros2_bags``: one bag is one
               ``*.db3`` (a rosbag2 directory, or a     episode; a directory of bags is one
               directory of them)                       episode per bag, in name order
=============  ======================================  ========================================

The CLI (``robofleet data``) and the run path call :func:`import_data` into a catalog dataset
(``lab_data.catalog.DatasetCatalog``) and :func:`describe` for what a buffer holds.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

FORMATS = ("lerobot", "robofleet", "ros2")
Progress = Callable[[int, int], None]


def detect_format(path: Path) -> str:
    """``lerobot``, ``robofleet`` or ``ros2`` (see the module table).

    Raises:
        ValueError: ``path`` does not exist or is none of them (names what was looked for).
    """
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: no such file or directory")
    if (path / "meta" / "info.json").is_file():
        return "lerobot"
    if (path / "schema.json").is_file():
        return "robofleet"
    if _bags(path):
        return "ros2"
    raise ValueError(
        f"{path}: not a dataset robofleet reads (looked for meta/info.json: LeRobotDataset v3; "
        "schema.json: robofleet buffer; metadata.yaml, *.mcap or *.db3: ROS 2 bag)"
    )


def _is_bag(path: Path) -> bool:
    if path.is_file():
        return path.suffix in (".mcap", ".db3")
    return (path / "metadata.yaml").is_file() or any(
        p.suffix in (".mcap", ".db3") for p in path.iterdir()
    )


def _bags(path: Path) -> list[Path]:
    """The bags at ``path``: itself, or its sub-directories that are bags (name order)."""
    if _is_bag(path):
        return [path]
    if not path.is_dir():
        return []
    return sorted(p for p in path.iterdir() if p.is_dir() and _is_bag(p))


def import_data(
    source: Path,
    dest_buffer_dir: Path,
    *,
    format: str | None = None,
    robot_id: str | None = None,
    task: str | None = None,
    progress: Progress | None = None,
    **options: Any,
) -> Path:
    """Import ``source`` into the new buffer directory ``dest_buffer_dir``.

    Args:
        source: a LeRobotDataset v3 directory, a robofleet buffer directory or ROS 2 bag(s).
        dest_buffer_dir: must not exist yet (a catalog's ``create`` hands one out).
        format: one of :data:`FORMATS`; detected when None.
        robot_id: the steps' ``robot_id`` (default: ``lerobot`` / ``ros2-bag``; a robofleet
            buffer keeps its own).
        task: the steps' task name (LeRobot: replaces the dataset's task strings; ROS 2:
            the bags' task; a robofleet buffer keeps its own).
        progress: ``progress(done, total)``: frames for LeRobot, bags for ROS 2, files for a
            robofleet buffer.
        options: LeRobot: ``ignore_columns`` (list of column names), ``repo_id``,
            ``run_id``, ``chunk``; ROS 2: ``joints`` (names; default those of the first
            state message), ``state_topic``, ``command_topic`` (None: none), ``run_id``.

    Returns:
        ``dest_buffer_dir``.

    Raises:
        ValueError: unknown format or option, an undetectable source, or what the importer
            refuses (a column LeRobot data has that robofleet cannot carry, a bag without
            the topic or joints: ``lab_data.ros2_bags.BagImportError``).
        FileExistsError: ``dest_buffer_dir`` exists.
    """
    source, dest = Path(source), Path(dest_buffer_dir)
    fmt = format or detect_format(source)
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r} (choose from {', '.join(FORMATS)})")
    if dest.exists():
        raise FileExistsError(f"{dest} exists already")
    if fmt == "lerobot":
        return _import_lerobot(source, dest, robot_id, task, progress, options)
    if fmt == "ros2":
        return _import_bags(source, dest, robot_id, task, progress, options)
    _no_options(options, "robofleet", ())
    if robot_id is not None or task is not None:
        raise ValueError("a robofleet buffer keeps its own robot ids and tasks")
    return _copy_buffer(source, dest, progress)


def _no_options(options: dict[str, Any], fmt: str, allowed: Sequence[str]) -> None:
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(
            f"options {unknown} do not apply to {fmt} data (it takes {list(allowed) or 'none'})"
        )


def _import_lerobot(
    source: Path,
    dest: Path,
    robot_id: str | None,
    task: str | None,
    progress: Progress | None,
    options: dict[str, Any],
) -> Path:
    from lab_data.lerobot_io import import_lerobot

    _no_options(options, "lerobot", ("ignore_columns", "repo_id", "run_id", "chunk"))
    return import_lerobot(
        source, dest, robot_id=robot_id or "lerobot", task=task, progress=progress, **options
    )


def _import_bags(
    source: Path,
    dest: Path,
    robot_id: str | None,
    task: str | None,
    progress: Progress | None,
    options: dict[str, Any],
) -> Path:
    from buffer.replay_buffer import ReplayBuffer
    from lab_data.ros2_bags import bag_schema, import_bag_into_buffer, joint_names

    _no_options(options, "ros2", ("joints", "state_topic", "command_topic", "run_id"))
    bags = _bags(source)
    if not bags:
        raise ValueError(f"{source}: no ROS 2 bag (metadata.yaml, *.mcap or *.db3)")
    state_topic = options.get("state_topic") or "/joint_states"
    joints = list(options.get("joints") or joint_names(bags[0], state_topic))
    run_id = options.get("run_id") or f"rosbag:{source.name}"
    command_topic = options.get("command_topic", "/joint_commands")
    with ReplayBuffer.open(dest, bag_schema(joints)) as buf:
        for i, bag in enumerate(bags):
            import_bag_into_buffer(
                bag,
                buf,
                joints,
                robot_id=robot_id or "ros2-bag",
                run_id=run_id,
                task=task or "",
                episode_index=i,
                state_topic=state_topic,
                command_topic=command_topic,
            )
            if progress is not None:
                progress(i + 1, len(bags))
    return dest


def _copy_buffer(source: Path, dest: Path, progress: Progress | None) -> Path:
    """Copy a buffer directory's files (not its ``LOCK``); a torn WAL tail is dropped as on
    any open."""
    files = [p for p in sorted(source.rglob("*")) if p.is_file() and p.name != "LOCK"]
    for i, f in enumerate(files):
        target = dest / f.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, target)
        if progress is not None:
            progress(i + 1, len(files))
    return dest


def describe(buffer_dir: Path) -> dict[str, Any]:
    """What a buffer directory holds: ``lab_data.catalog.summarize`` (``rows``, ``episodes``,
    ``tasks``, ``features`` with ``dtype`` / ``shape``, ``intervention_rows``,
    ``successful_episodes``, ``bytes_on_disk``, ...) plus ``intervention_share`` (of rows,
    0..1) and ``success_share`` (successful / all episodes, 0..1; None with no outcomes).

    Raises:
        ValueError: not a buffer directory.
    """
    from lab_data.catalog import summarize

    if not (Path(buffer_dir) / "schema.json").is_file():
        raise ValueError(f"{buffer_dir}: not a robofleet buffer directory (no schema.json)")
    info = summarize(Path(buffer_dir))
    rows, eps = info["rows"], info["episodes"]
    judged = info["successful_episodes"] + info["failed_episodes"]
    info["intervention_share"] = info["intervention_rows"] / rows if rows else 0.0
    info["success_share"] = info["successful_episodes"] / eps if eps and judged else None
    return info
