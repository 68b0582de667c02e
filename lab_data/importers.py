"""Importers registered by format: what turns a lab's recordings into a robofleet buffer.

Each format is one :class:`DatasetImporter` (``lerobot``: LeRobotDataset v3, ``ros2``: rosbag2
recordings, ``robofleet``: a buffer directory). Another package adds one with :func:`register`
or an entry point in the ``robofleet.dataset_importers`` group naming a zero-argument factory;
the CLI (``robofleet data import``), a run's offline mounts (``runs.offline``) and the benches
only call :func:`detect_format`, :func:`importer` and :func:`import_data`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from buffer.table.schema import StepSchema

Progress = Callable[[int, int], None]
ENTRY_POINT_GROUP = "robofleet.dataset_importers"


@dataclass(frozen=True)
class ImportJob:
    """One import: ``source`` into the new buffer directory ``dest``.

    Attributes:
        robot_id: the steps' ``robot_id`` (None: the importer's default).
        task: the task name every step takes (None: the source's own task names).
        progress: ``progress(done, total)`` in the importer's unit (frames, bags, files).
        options: the importer's own options, already checked against its ``options``.
    """

    source: Path
    dest: Path
    robot_id: str | None = None
    task: str | None = None
    progress: Progress | None = None
    options: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class DatasetImporter(Protocol):
    """One dataset format.

    Attributes:
        format: the format's name (``--format``, ``offline_data[k].format``).
        recognised_by: what :meth:`detect` looks for, for error messages.
        options: the keyword options :meth:`import_into` takes beyond the common ones.
        keeps_robot_ids: rows carry their own ``robot_id`` (a ``robot_id`` given is refused).
    """

    format: str
    recognised_by: str
    options: tuple[str, ...]
    keeps_robot_ids: bool

    def detect(self, path: Path) -> bool:
        """Whether ``path`` (an existing file or directory) is of this format."""
        ...

    def schema(
        self, path: Path, options: Mapping[str, Any], task: str | None
    ) -> tuple[StepSchema, list[str]]:
        """(step schema, task names) of ``path`` read from its metadata, without importing
        (tasks empty when unknown before an import; ``task``: the name every row will take).

        Raises:
            ValueError: the metadata cannot be read or lacks what is needed (named).
        """
        ...

    def import_into(self, job: ImportJob) -> Path:
        """Write ``job.source``'s steps into the new buffer directory ``job.dest``; returns it.

        Raises:
            ValueError: what the format refuses (named); options are already checked.
        """
        ...


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
        from lab_data.buffer_copy import BufferImporter
        from lab_data.lerobot_import import LeRobotImporter
        from lab_data.ros2_bags import Ros2BagImporter

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
