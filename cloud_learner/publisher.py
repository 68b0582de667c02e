"""Weight publishers (:class:`cloud_learner.core.WeightPublisher`) for tests and single hosts.

The fleet's real distributor lives in ``comms/``; anything with
``publish(version: int, weights: Mapping[str, Tensor]) -> None`` plugs into the learner.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from robofleet.durable import fsync_dir


class InMemoryWeightPublisher:
    """Keeps every published version in memory (tests)."""

    def __init__(self) -> None:
        self.versions: dict[int, dict[str, torch.Tensor]] = {}

    def latest_version(self) -> int:
        return max(self.versions, default=0)

    def publish(self, version: int, weights: Mapping[str, torch.Tensor]) -> None:
        if self.versions and version <= max(self.versions):
            raise ValueError(f"version {version} is not above the last ({max(self.versions)})")
        self.versions[version] = {k: v.detach().cpu().clone() for k, v in weights.items()}


class FileWeightPublisher:
    """Writes ``<dir>/v<version>.safetensors`` atomically and points ``latest.json`` at it.

    A reader (edge agent, test) reads ``latest.json`` -> ``{"version": N, "file": ...}`` and
    loads the tensors with safetensors: no pickle anywhere. Keeps the last ``keep`` files.
    """

    def __init__(self, directory: Path | str, keep: int = 3) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.keep = keep

    def latest_version(self) -> int:
        path = self.directory / "latest.json"
        if not path.exists():
            return 0
        return int(json.loads(path.read_text())["version"])

    def publish(self, version: int, weights: Mapping[str, torch.Tensor]) -> None:
        last = self.latest_version()
        if version <= last:
            raise ValueError(f"version {version} is not above the last published ({last})")
        name = f"v{version:08d}.safetensors"
        tmp = self.directory / f".{name}.tmp"
        save_file({k: v.detach().cpu().contiguous() for k, v in weights.items()}, str(tmp))
        _fsync_file(tmp)
        os.replace(tmp, self.directory / name)
        pointer = self.directory / ".latest.json.tmp"
        pointer.write_text(json.dumps({"version": version, "file": name}))
        _fsync_file(pointer)
        os.replace(pointer, self.directory / "latest.json")
        fsync_dir(self.directory)
        for old in sorted(self.directory.glob("v*.safetensors"))[: -self.keep]:
            old.unlink(missing_ok=True)

    def load_latest(self) -> tuple[int, dict[str, torch.Tensor]]:
        """(version, weights) of the newest publication; (0, {}) when none."""
        path = self.directory / "latest.json"
        if not path.exists():
            return 0, {}
        meta = json.loads(path.read_text())
        return int(meta["version"]), load_file(str(self.directory / meta["file"]))


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


class CommsWeightPublisher:
    """The fleet's distributor (``comms.publisher.WeightPublisher``) behind our seam.

    ``comms_publisher.publish(state, version=..., learner_step=...)`` snapshots the tensors and
    streams them (chunked, delta-encoded, checksummed) to edge agents. ``version_floor``
    returns the highest version robots may already hold (e.g. from the metadata store's
    ``policy_versions``), so a resumed learner never reuses a version number.
    """

    def __init__(
        self,
        comms_publisher: Any,
        learner_step: Callable[[], int] = lambda: 0,
        version_floor: Callable[[], int] = lambda: 0,
    ) -> None:
        self.comms = comms_publisher
        self.learner_step = learner_step
        self.version_floor = version_floor
        self._last = 0

    def latest_version(self) -> int:
        return max(self._last, int(self.version_floor()))

    def publish(self, version: int, weights: Mapping[str, torch.Tensor]) -> None:
        self.comms.publish(dict(weights), version=version, learner_step=self.learner_step())
        self._last = version
