"""LeRobotDataset v3 export/import (filled in below)."""

from __future__ import annotations

from typing import Any


def export_lerobot(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError


def import_lerobot(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError
