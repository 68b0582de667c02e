"""A :class:`foundation.contracts.WeightPublisher` for tests: versions kept in memory.

A run's learner publishes through ``comms.cloud.weight_file.WeightDirectory`` (files the cloud
process hands to comms' distributor); anything with ``latest_version() -> int`` and
``publish(version, weights)`` plugs into the learner.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch


class InMemoryWeightPublisher:
    """Keeps every published version in memory (tests).

    Raises (``publish``): ValueError when ``version`` is not above the last one.
    """

    def __init__(self) -> None:
        self.versions: dict[int, dict[str, torch.Tensor]] = {}

    def latest_version(self) -> int:
        return max(self.versions, default=0)

    def publish(self, version: int, weights: Mapping[str, torch.Tensor]) -> None:
        if self.versions and version <= max(self.versions):
            raise ValueError(f"version {version} is not above the last ({max(self.versions)})")
        self.versions[version] = {k: v.detach().cpu().clone() for k, v in weights.items()}
