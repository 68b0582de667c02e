"""Fixtures: a migrated metadata store with one run; a free loopback port."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from robofleet.store.models import Run
from robofleet.store.store import MetadataStore, upgrade

RUN = "run-1"


@pytest.fixture
def db(tmp_path: Path) -> Iterator[tuple[str, MetadataStore]]:
    url = f"sqlite:///{tmp_path}/meta.db"
    upgrade(url)
    store = MetadataStore(url)
    with store.session() as s:
        s.add(Run(id=RUN, algorithm="hg_dagger"))
    yield url, store
    store.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
