"""Fixtures for comms tests: a migrated SQLite metadata store and a live cloud server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from comms.server import CloudServer
from comms.sink import MemorySink
from robofleet.store.models import Run
from robofleet.store.store import MetadataStore, upgrade
from tests.comms.helpers import RUN, Cloud, fast_settings


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MetadataStore]:
    url = f"sqlite:///{tmp_path}/meta.db"
    upgrade(url)
    st = MetadataStore(url)
    with st.session() as s:
        s.add(Run(id=RUN, algorithm="hg_dagger"))
        s.add(Run(id="run-other", algorithm="hg_dagger"))
    yield st
    st.close()


@pytest.fixture
def cloud(store: MetadataStore) -> Iterator[Cloud]:
    settings = fast_settings()
    sink = MemorySink()
    server = CloudServer(settings, store, sink)
    server.start()
    yield Cloud(server, sink, settings, store)
    server.close()
