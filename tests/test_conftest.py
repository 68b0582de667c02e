"""The suite's own set-up in tests/conftest.py."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import CLOUD_FILES

REPO = Path(__file__).resolve().parents[1]


def test_every_file_of_the_cloud_worker_group_exists() -> None:
    # A moved or renamed system test would leave the group silently and could then run beside
    # another real cloud under pytest-xdist.
    assert CLOUD_FILES and all((REPO / path).is_file() for path in CLOUD_FILES)
