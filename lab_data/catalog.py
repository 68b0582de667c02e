"""The dataset catalog: imported datasets kept as buffer directories, each with its provenance.

Layout under the catalog's root (``<data_dir>/datasets``)::

    <name>/buffer/         a robofleet buffer directory (mount it; nothing is copied again)
    <name>/dataset.json    provenance: name, format, source, imported_at, rows, episodes,
                           tasks, features, intervention_rows, successful_episodes
    .<name>.tmp-<pid>/     an import in progress (never listed; renamed into place when done)

A dataset appears only complete: :meth:`DatasetCatalog.create` fills a temporary directory
beside the final one, writes ``dataset.json`` (``foundation.durable``), fsyncs the tree and
renames it into place, so a crash mid-import leaves no half dataset under its name.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from foundation.durable import atomic_write_json, fsync_dir, fsync_tree
from foundation.runspec import TASK_PATTERN

INFO_FILE = "dataset.json"
BUFFER_DIR = "buffer"


class UnknownDataset(ValueError):
    """No dataset of that name in the catalog (the message names the known ones)."""


class DatasetExists(ValueError):
    """A dataset of that name is already in the catalog."""


class DatasetCatalog:
    """The datasets under ``root`` (created when the first dataset is)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def names(self) -> list[str]:
        """Complete datasets' names, sorted."""
        if not self.root.is_dir():
            return []
        return sorted(
            p.name
            for p in self.root.iterdir()
            if not p.name.startswith(".") and (p / INFO_FILE).is_file()
        )

    def buffer_dir(self, name: str) -> Path:
        """The dataset's buffer directory.

        Raises:
            UnknownDataset: no such dataset (names the known ones).
        """
        return self._dir(name) / BUFFER_DIR

    def info(self, name: str) -> dict[str, Any]:
        """The dataset's ``dataset.json``.

        Raises:
            UnknownDataset: no such dataset.
        """
        import json

        return dict(json.loads((self._dir(name) / INFO_FILE).read_text()))

    def create(
        self,
        name: str,
        fill: Callable[[Path], None],
        *,
        format: str = "",
        source: str | Path | None = None,
    ) -> Path:
        """Make dataset ``name``: ``fill(buffer_dir)`` writes a buffer directory (an import)
        into a temporary directory, which is renamed into place only once complete.

        Args:
            name: 1-128 of ``[A-Za-z0-9_.-]``, starting alphanumeric (like task names).
            fill: creates the buffer at the path it is given (which does not exist yet).
            format: recorded in ``dataset.json`` (``lerobot``, ``ros2``, ``robofleet``).
            source: recorded in ``dataset.json`` (where the data came from).

        Returns:
            The dataset's buffer directory.

        Raises:
            ValueError: an invalid name.
            DatasetExists: the name is taken.
            Exception: whatever ``fill`` raised; nothing is left behind.
        """
        if not TASK_PATTERN.fullmatch(name):
            raise ValueError(
                f"dataset name {name!r} must be 1-128 of [A-Za-z0-9_.-], starting alphanumeric"
            )
        final = self.root / name
        if final.exists():
            raise DatasetExists(f"dataset {name!r} exists already ({final})")
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".{name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            fill(tmp / BUFFER_DIR)
            info = {
                "name": name,
                "format": format,
                "source": str(source) if source is not None else None,
                "imported_at": time.time(),
                **summarize(tmp / BUFFER_DIR),
            }
            atomic_write_json(tmp / INFO_FILE, info)
            fsync_tree(tmp)
            if final.exists():
                raise DatasetExists(f"dataset {name!r} appeared during the import ({final})")
            os.rename(tmp, final)
            fsync_dir(self.root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return final / BUFFER_DIR

    def remove(self, name: str) -> None:
        """Delete the dataset (renamed out of the catalog first, so it vanishes at once).

        Raises:
            UnknownDataset: no such dataset.
        """
        d = self._dir(name)
        trash = self.root / f".{name}.removing-{os.getpid()}"
        os.rename(d, trash)
        fsync_dir(self.root)
        shutil.rmtree(trash)

    def _dir(self, name: str) -> Path:
        d = self.root / name
        if not TASK_PATTERN.fullmatch(name) or not (d / INFO_FILE).is_file():
            known = ", ".join(self.names()) or "none"
            raise UnknownDataset(f"no dataset {name!r} in {self.root} (known: {known})")
        return d


def summarize(directory: Path) -> dict[str, Any]:
    """What a buffer directory holds: ``rows`` (steps), ``transitions``, ``episodes``,
    ``tasks`` (name -> steps), ``robots``, ``runs``, ``features`` (name -> ``{dtype,
    shape}``), ``intervention_rows``, ``successful_episodes``, ``failed_episodes``,
    ``discarded_episodes`` and ``bytes_on_disk``. Opens the buffer read-only.

    Raises:
        FileNotFoundError: not a buffer directory.
    """
    from buffer.table.replay_buffer import ReplayBuffer

    with ReplayBuffer.open(directory, read_only=True) as buf:
        s = buf.index_summary()
        schema = buf.schema
    features = {
        name: {"dtype": "image" if f.is_image else str(f.dtype), "shape": list(f.shape)}
        for name, f in {**schema.observations, "action": schema.action}.items()
    }
    size = sum(p.stat().st_size for p in Path(directory).rglob("*") if p.is_file())
    return {
        "rows": s["rows"],
        "transitions": s["transitions"],
        "episodes": s["episodes"],
        "tasks": s["tasks"],
        "robots": sorted(s["robots"]),
        "runs": s["runs"],
        "features": features,
        "intervention_rows": s["interventions"],
        "successful_episodes": s["successful_episodes"],
        "failed_episodes": s["failed_episodes"],
        "discarded_episodes": sum(s["discarded_episodes"].values()),
        "bytes_on_disk": size,
    }


def describe(buffer_dir: Path) -> dict[str, Any]:
    """:func:`summarize` plus ``intervention_share`` (of rows, 0..1) and ``success_share``
    (successful / all episodes, 0..1; None with no outcomes).

    Raises:
        ValueError: not a buffer directory.
    """
    if not (Path(buffer_dir) / "schema.json").is_file():
        raise ValueError(f"{buffer_dir}: not a robofleet buffer directory (no schema.json)")
    info = summarize(Path(buffer_dir))
    rows, eps = info["rows"], info["episodes"]
    judged = info["successful_episodes"] + info["failed_episodes"]
    info["intervention_share"] = info["intervention_rows"] / rows if rows else 0.0
    info["success_share"] = info["successful_episodes"] / eps if eps and judged else None
    return info
