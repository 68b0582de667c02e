"""The running cloud's pid file (``<data_dir>/cloud.json``): which process drives the runs.

``robofleet run`` and a dashboard without a cloud read it to tell whether a request will be
acted on (:func:`cloud_running`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from foundation.durable import atomic_write_text

PIDFILE = "cloud.json"


def write_pidfile(data_dir: Path, **addresses: str | None) -> None:
    """Record this process as the cloud of ``data_dir``, with its service addresses."""
    atomic_write_text(data_dir / PIDFILE, json.dumps({"pid": os.getpid(), **addresses}))


def remove_pidfile(data_dir: Path) -> None:
    (data_dir / PIDFILE).unlink(missing_ok=True)


def cloud_running(data_dir: Path) -> dict[str, Any] | None:
    """The pid file of a live cloud using ``data_dir``, or None."""
    path = data_dir / PIDFILE
    if not path.exists():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    try:
        os.kill(int(data["pid"]), 0)
    except (ProcessLookupError, PermissionError):
        return None
    return data
