"""Fixtures: a migrated metadata store with one run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from foundation.store.metadata_store import MetadataStore
from tests.fakes.cloud import RUN, migrated_store


@pytest.fixture
def db(tmp_path: Path) -> Iterator[tuple[str, MetadataStore]]:
    url = f"sqlite:///{tmp_path}/meta.db"
    store = migrated_store(url, RUN)
    yield url, store
    store.close()
