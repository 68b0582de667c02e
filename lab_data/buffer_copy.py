"""The ``robofleet`` format: a buffer directory, copied file by file (a run mounts one in place
without this copy)."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lab_data.importing import ImportJob

if TYPE_CHECKING:
    from buffer.table.schema import StepSchema


class BufferImporter:
    """A robofleet buffer directory (``schema.json``); its rows keep their robot ids and tasks."""

    format = "robofleet"
    recognised_by = "schema.json"
    options: tuple[str, ...] = ()
    keeps_robot_ids = True

    def detect(self, path: Path) -> bool:
        return (path / "schema.json").is_file()

    def schema(
        self, path: Path, options: Mapping[str, Any], task: str | None
    ) -> tuple[StepSchema, list[str]]:
        from buffer.table.schema import StepSchema

        return StepSchema.from_json((path / "schema.json").read_text()), []

    def import_into(self, job: ImportJob) -> Path:
        """Copy the directory's files (not its ``LOCK``); a torn WAL tail is dropped as on
        any open.

        Raises:
            ValueError: a ``task`` was given (a buffer keeps its own tasks).
        """
        if job.task is not None:
            raise ValueError("a robofleet buffer keeps its own robot ids and tasks")
        files = [p for p in sorted(job.source.rglob("*")) if p.is_file() and p.name != "LOCK"]
        for i, f in enumerate(files):
            target = job.dest / f.relative_to(job.source)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, target)
            if job.progress is not None:
                job.progress(i + 1, len(files))
        return job.dest
