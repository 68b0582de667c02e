"""Shared set-up of the comms benchmarks: a throwaway metadata store, a cloud server, robots."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from comms.cloud.server import CloudServer
from comms.cloud.shard_routes import RouteResolver
from comms.cloud.step_sink import MemorySink, StepSink
from comms.config import CommsSettings
from comms.robot.client import EdgeClient, enroll, make_channel
from foundation.store.metadata_store import MetadataStore, upgrade
from foundation.store.models import Run

RUN = "bench"


@dataclass
class BenchCloud:
    server: CloudServer
    store: MetadataStore
    settings: CommsSettings
    tmp: tempfile.TemporaryDirectory[str]

    def robots(self, n: int) -> list[tuple[int, str]]:
        out: list[tuple[int, str]] = []
        ch = make_channel(self.server.address, self.settings)
        for _ in range(n):
            token = self.store.create_enrollment_token(timedelta(minutes=10))
            i = len(self.store.active_leases(RUN)) + len(out)
            rid, cred = enroll(ch, token, f"bench-{id(self)}-{i}", "bench")
            out.append((rid, cred))
        ch.close()
        self.store.lease_robots(RUN, [r for r, _ in out])
        return out

    def client(self, credential: str) -> EdgeClient:
        address = self.server.address
        return EdgeClient(
            make_channel(address, self.settings), credential, self.settings, address=address
        )

    def close(self) -> None:
        self.server.close()
        self.store.close()
        self.tmp.cleanup()


def start_cloud(
    sink: StepSink | None = None, routes: RouteResolver | None = None, **settings: object
) -> BenchCloud:
    """A cloud server on a throwaway store with the run ``RUN``; ``routes``: a sharded run's
    ingest routes (``Ingest.Route``); ``settings``: ``CommsSettings`` fields."""
    tmp = tempfile.TemporaryDirectory(prefix="robofleet-bench-")
    url = f"sqlite:///{Path(tmp.name) / 'meta.db'}"
    upgrade(url)
    store = MetadataStore(url)
    with store.session() as s:
        s.add(Run(id=RUN, algorithm="bench"))
    cs = CommsSettings(grpc_port=0, auth_cache_s=5.0, **settings)  # type: ignore[arg-type]
    server = CloudServer(cs, store, sink or MemorySink(), routes=routes)
    server.start()
    return BenchCloud(server, store, cs, tmp)
