"""What every run of one cloud shares (:class:`CloudContext`): the settings, the metadata
store, comms' server, the sinks and the learner's restart policy. Its own module so each part
of a run can name it without the run's driver.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from foundation.store.metadata_store import MetadataStore
from runs.supervisor import RestartPolicy


@dataclass
class CloudContext:
    """What every run of one cloud shares."""

    settings: Any
    store: MetadataStore
    server: Any  # comms.cloud.server.CloudServer
    server_address: str
    sinks: dict[str, Any]
    python: str
    routes: dict[str, Any] = field(default_factory=dict)  # run id -> a sharded run's ShardRoutes
    learner_restarts: RestartPolicy = field(default_factory=RestartPolicy)
    eval_every_s: float | None = None
