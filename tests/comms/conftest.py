"""Fixtures for comms tests: a migrated SQLite metadata store, a live cloud server and a disk
that fills up (``full_disk``, tests.fakes.disk)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from comms.cloud.step_sink import MemorySink
from foundation.store.metadata_store import MetadataStore
from tests.fakes.cloud import RUN, Cloud, migrated_store
from tests.fakes.disk import full_disk


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MetadataStore]:
    st = migrated_store(f"sqlite:///{tmp_path}/meta.db", RUN, "run-other")
    yield st
    st.close()


@pytest.fixture
def cloud(store: MetadataStore) -> Iterator[Cloud[MemorySink]]:
    with Cloud(store, MemorySink()) as c:
        yield c


__all__ = ["cloud", "full_disk", "store"]
