"""The robot credential file: one layout, mode 0600, written whole."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from edge_agent.credential import (
    RobotCredential,
    credential_path,
    read_credential,
    write_credential,
)


def test_written_credential_reads_back_with_the_enrolled_layout_and_mode_0600(tmp_path: Path):
    spool = tmp_path / "robots" / "r1"  # created on write
    assert read_credential(spool) is None
    write_credential(spool, RobotCredential(7, "secret"))
    path = credential_path(spool)
    assert path == spool / "credential.json"
    assert json.loads(path.read_text()) == {"robot_id": 7, "credential": "secret"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_credential(spool) == RobotCredential(7, "secret")
    assert [p.name for p in spool.iterdir()] == ["credential.json"]  # no temporary left


def test_a_credential_without_its_fields_is_refused_naming_the_file(tmp_path: Path):
    credential_path(tmp_path).write_text(json.dumps({"robot_id": 3}))
    with pytest.raises(ValueError, match="credential.json"):
        read_credential(tmp_path)
