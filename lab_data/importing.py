"""What an importer is: one dataset format turned into a robofleet buffer (:class:`DatasetImporter`)
and the one import it is asked for (:class:`ImportJob`). The registry is ``lab_data.registry``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from buffer.table.schema import StepSchema

Progress = Callable[[int, int], None]


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
