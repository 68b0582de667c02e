"""Importers registered by format: ``lerobot`` (LeRobotDataset v3), ``robofleet`` (a buffer
directory), ``ros2`` (rosbag2 recordings), and any a lab adds with :func:`register` or an entry
point in the ``robofleet.dataset_importers`` group naming a zero-argument factory. The CLI
(``robofleet data import``), a run's offline mounts (``runs.offline``) and the benches call
:func:`detect_format`, :func:`importer` and :func:`import_data`.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from lab_data.buffer_copy import BufferImporter
from lab_data.importing import DatasetImporter, ImportJob, Progress
from lab_data.lerobot_import import LeRobotImporter
from lab_data.ros2_bags import Ros2BagImporter

ENTRY_POINT_GROUP = "robofleet.dataset_importers"

_REGISTRY: dict[str, DatasetImporter] = {}
_loaded = False


def register(imp: DatasetImporter) -> None:
    """Add ``imp`` under ``imp.format`` (detection tries formats in registration order).

    Raises:
        ValueError: another importer already has that format.
    """
    known = _REGISTRY.get(imp.format)
    if known is not None and known is not imp:
        raise ValueError(f"a {imp.format!r} importer is registered already ({known!r})")
    _REGISTRY[imp.format] = imp


def _importers() -> dict[str, DatasetImporter]:
    global _loaded
    if not _loaded:
        _loaded = True
        for built_in in (LeRobotImporter(), BufferImporter(), Ros2BagImporter()):
            register(built_in)
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            register(ep.load()())
    return _REGISTRY


def formats() -> tuple[str, ...]:
    """Every registered format's name, in detection order."""
    return tuple(_importers())


def importer(format: str) -> DatasetImporter:
    """The importer of ``format``.

    Raises:
        ValueError: no importer of that name (names the known ones).
    """
    found = _importers().get(format)
    if found is None:
        raise ValueError(f"unknown format {format!r} (choose from {', '.join(formats())})")
    return found


def detect_format(path: Path) -> str:
    """The first registered format that recognises ``path``.

    Raises:
        ValueError: ``path`` does not exist or no importer recognises it (names what each
            looked for).
    """
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: no such file or directory")
    for imp in _importers().values():
        if imp.detect(path):
            return imp.format
    looked = "; ".join(f"{imp.recognised_by}: {imp.format}" for imp in _importers().values())
    raise ValueError(f"{path}: not a dataset robofleet reads (looked for {looked})")


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
        format: a registered format; detected when None.
        robot_id: the steps' ``robot_id`` (None: the importer's default; refused for a
            format whose rows keep their own).
        task: the steps' task name (None: the source's own task names).
        progress: ``progress(done, total)`` in the importer's unit (frames, bags, files).
        options: the importer's own options (:attr:`DatasetImporter.options`).

    Returns:
        ``dest_buffer_dir``.

    Raises:
        ValueError: unknown format or option, an undetectable source, or what the importer
            refuses (named).
        FileExistsError: ``dest_buffer_dir`` exists.
    """
    source, dest = Path(source), Path(dest_buffer_dir)
    imp = importer(format or detect_format(source))
    if dest.exists():
        raise FileExistsError(f"{dest} exists already")
    unknown = sorted(set(options) - set(imp.options))
    if unknown:
        raise ValueError(
            f"options {unknown} do not apply to {imp.format} data "
            f"(it takes {list(imp.options) or 'none'})"
        )
    if imp.keeps_robot_ids and robot_id is not None:
        raise ValueError(f"{imp.format} data keeps its own robot ids")
    return imp.import_into(ImportJob(source, dest, robot_id, task, progress, dict(options)))
