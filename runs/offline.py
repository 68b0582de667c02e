"""A run's offline data (``buffer.offline_data``): find each source, check it against the run's
features and tasks before anything is leased, bring it into the run and mount it.

A source (``foundation.runspec.OfflineSource``) names, in this order of lookup:

1. a dataset of the data catalog (``<data_dir>/datasets/<name>``, ``robofleet data import``);
2. an earlier run (``<data_dir>/runs/<id>/buffer``);
3. a path: a robofleet buffer directory, a LeRobotDataset v3 directory (``meta/info.json``) or
   a ROS 2 bag (``metadata.yaml``, ``*.mcap``, ``*.db3``).

Robofleet buffers (catalog datasets, runs, buffer directories) are mounted read-only without
copying (``buffer.ReplayBuffer.mount``). A LeRobot dataset or a ROS 2 bag is imported once into
the run's offline store, ``<run_dir>/offline/<k>/buffer`` (a temporary directory renamed into
place when complete, so a crash mid-import imports again and a resumed run reuses it), images
kept as uint8. The mount's filters (tasks, robots, successful episodes, interventions, a time
range) and ``task`` (the run task every row counts as) come from the source.

Every mounted source is described in ``<run_dir>/offline.json`` (its provenance: what it
named, what was found, the filters, the rows kept), which the run's report carries.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from buffer.table.opening import SHARDS_FILE
from foundation.durable import atomic_write_text
from foundation.runspec import OfflineSource, RunSpec
from lab_data.buffer_copy import BufferImporter
from lab_data.registry import detect_format, importer

PROVENANCE = "offline.json"
OFFLINE_ROBOT = "offline"  # robot_id of imported rows that carry none of their own
# Buffers are mounted read-only where they are, never copied.
MOUNTED_IN_PLACE = BufferImporter.format


class OfflineDataError(ValueError):
    """An offline source cannot be used; ``errors`` maps ``buffer.offline_data[k]`` to why."""

    def __init__(self, errors: dict[str, str]) -> None:
        self.errors = errors
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))


@dataclass(frozen=True)
class Located:
    """Where a source was found.

    Attributes:
        found_as: ``dataset`` (catalog), ``run`` or ``path``.
        format: ``robofleet``, ``lerobot`` or ``ros2``.
        path: the dataset's buffer directory, the run's buffer, or the path.
    """

    found_as: str
    format: str
    path: Path


def field_of(k: int) -> str:
    return f"buffer.offline_data[{k}]"


def locate(source: OfflineSource, data_dir: Path) -> Located:
    """Find ``source`` (module docstring for the order).

    Raises:
        ValueError: nothing of that name or path, or a path of no known format (named).
    """
    from lab_data.catalog import DatasetCatalog

    if source.format != "auto":
        importer(source.format)  # an unknown format is refused whatever the source is
    name = source.source
    catalog = DatasetCatalog(data_dir / "datasets")
    if "/" not in name and name in catalog.names():
        return Located("dataset", MOUNTED_IN_PLACE, catalog.buffer_dir(name))
    run = data_dir / "runs" / name / "buffer"
    if "/" not in name and (run / "schema.json").is_file():
        if (run / SHARDS_FILE).is_file():
            raise ValueError(f"run {name} keeps its buffer in shards; it cannot be mounted")
        return Located("run", MOUNTED_IN_PLACE, run)
    path = Path(name).expanduser()
    if not path.exists():
        raise ValueError(
            f"{name!r} is no dataset of the catalog (robofleet data ls), no run with a buffer "
            f"and no path that exists"
        )
    found = detect_format(path)
    if source.format != "auto" and found != importer(source.format).format:
        raise ValueError(f"{path} is a {found} source, not {source.format}")
    return Located("path", found, path)


# -- what a source holds, before anything is imported ------------------------------------------


def source_schema(located: Located, source: OfflineSource) -> tuple[Any, list[str]]:
    """(step schema, tasks) of a located source without importing it (its importer's
    ``schema``: ``buffer.StepSchema`` of its observations and ``action``; tasks empty when
    unknown before an import).

    Raises:
        ValueError: the source's metadata cannot be read or lacks what is needed (named).
    """
    return importer(located.format).schema(located.path, source.options, source.task)


def check_sources(
    spec: RunSpec, features: Mapping[str, Any] | None, data_dir: Path
) -> dict[str, str]:
    """Errors of the spec's offline sources against the run's ``features`` (observation
    features and ``action``, LeRobot feature dicts as the robots share them; None: not known,
    only located): ``{"buffer.offline_data[k]": why}``, each feature that differs named
    (``buffer.StepSchema.differences``); empty when every source fits."""
    from buffer.table.schema import StepSchema

    run = None
    if features is not None:
        obs = {k: v for k, v in features.items() if k != "action"}
        run = StepSchema.from_features(
            obs, {"action": features["action"]}, require_final_observation=False
        )
    errors: dict[str, str] = {}
    for k, source in enumerate(spec.buffer.offline_data):
        try:
            located = locate(source, data_dir)
            schema, tasks = source_schema(located, source)
        except (OSError, ValueError) as exc:
            errors[field_of(k)] = str(exc)
            continue
        problems = [] if run is None else run.differences(schema)
        problems += _task_problems(spec, source, tasks)
        if problems:
            errors[field_of(k)] = f"{source.source}: " + "; ".join(problems)
    return errors


def _task_problems(spec: RunSpec, source: OfflineSource, tasks: Sequence[str]) -> list[str]:
    if source.task is not None:
        if source.task not in spec.tasks:
            return [f"task {source.task!r} is not one of the run's tasks {list(spec.tasks)}"]
        return []
    wanted = source.tasks if source.tasks is not None else list(tasks)
    foreign = sorted({t for t in wanted if t not in spec.tasks})
    if foreign:
        return [
            f"its tasks {foreign} are not the run's {list(spec.tasks)}: keep some with tasks: "
            "[...], or count every row as one run task with task: NAME"
        ]
    return []


# -- into the run -------------------------------------------------------------------------------


def mount_sources(
    buffer: Any, spec: RunSpec, run_dir: Path, data_dir: Path
) -> list[dict[str, Any]]:
    """Mount every offline source of ``spec`` into the run's open ``buffer`` (importing
    LeRobot datasets and ROS 2 bags once into the run's offline store); returns and writes the
    provenance (``offline.json``), one entry per source.

    Raises:
        OfflineDataError: a source is gone, does not fit the buffer's schema, or its kept
            rows have tasks the run does not train (named per source); nothing stays mounted.
    """
    out: list[dict[str, Any]] = []
    errors: dict[str, str] = {}
    for k, source in enumerate(spec.buffer.offline_data):
        try:
            located = locate(source, data_dir)
            directory = (
                located.path
                if located.format == MOUNTED_IN_PLACE
                else _imported(located, source, run_dir / "offline" / str(k))
            )
            view = buffer.mount(directory, source.rows(), name=source.source, as_task=source.task)
        except (OSError, ValueError) as exc:
            errors[field_of(k)] = str(exc)
            continue
        foreign = sorted(set(view.task_names) - set(spec.tasks))
        if foreign:
            errors[field_of(k)] = (
                f"its rows have tasks {foreign} the run does not train ({list(spec.tasks)})"
            )
            continue
        out.append(_provenance(k, source, located, directory, view))
    if errors:
        for view in buffer.offline:  # let go of the directories mounted so far
            if view.buffer is not buffer:
                view.buffer.close()
        buffer.offline.clear()
        raise OfflineDataError(errors)
    atomic_write_text(run_dir / PROVENANCE, json.dumps(out, indent=2))
    return out


def _imported(located: Located, source: OfflineSource, store: Path) -> Path:
    """The buffer directory of ``located`` imported into ``store`` (once: an import that
    completed is reused)."""
    from lab_data.registry import import_data

    done = store / "buffer"
    if (done / "schema.json").is_file() and (store / "source.json").is_file():
        return done
    tmp = store.with_name(store.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    options: dict[str, Any] = dict(source.options)
    import_data(
        located.path,
        tmp / "buffer",
        format=located.format,
        robot_id=None if importer(located.format).keeps_robot_ids else OFFLINE_ROBOT,
        task=source.task,
        **options,
    )
    atomic_write_text(tmp / "source.json", json.dumps({"source": str(located.path)}))
    shutil.rmtree(store, ignore_errors=True)
    tmp.rename(store)
    return done


def _provenance(
    k: int, source: OfflineSource, located: Located, directory: Path, view: Any
) -> dict[str, Any]:
    return {
        "index": k,
        "source": source.source,
        "found_as": located.found_as,
        "format": located.format,
        "path": str(located.path),
        "mounted": str(directory),
        "copied": located.format != MOUNTED_IN_PLACE,
        "filters": source.rows().given(),
        "task": source.task,
        "rows": len(view),
        "tasks": list(view.task_names),
    }


def read_provenance(run_dir: Path) -> list[dict[str, Any]]:
    """The run's mounted sources (``offline.json``), empty when it has none."""
    try:
        data = json.loads((run_dir / PROVENANCE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return []
    return list(data) if isinstance(data, list) else []


def offline_sources(data_dir: Path, store: Any) -> list[dict[str, Any]]:
    """What a launch can mount (``RunManager.offline_sources``): the catalog's datasets (their
    ``dataset.json``: rows, episodes, tasks, format) and runs with a buffer (state, tasks from
    the store), read cheaply (no buffer is opened)."""
    from lab_data.catalog import DatasetCatalog

    catalog = DatasetCatalog(data_dir / "datasets")
    out: list[dict[str, Any]] = []
    for name in catalog.names():
        info = catalog.info(name)
        out.append(
            {
                "name": name,
                "kind": "dataset",
                "format": info.get("format"),
                "rows": info.get("rows"),
                "episodes": info.get("episodes"),
                "tasks": info.get("tasks"),
            }
        )
    runs = data_dir / "runs"
    for run_dir in sorted(runs.iterdir()) if runs.is_dir() else []:
        if not (run_dir / "buffer" / "schema.json").is_file():
            continue
        run = store.get_run(run_dir.name)
        out.append(
            {
                "name": run_dir.name,
                "kind": "run",
                "state": run.state.value if run is not None else None,
                "tasks": list((run.spec or {}).get("tasks", [])) if run is not None else [],
                "promoted": (run_dir / "promoted.safetensors").is_file(),
            }
        )
    return out
