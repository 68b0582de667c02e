"""``foundation.durable.append_line`` on a disk that fills up: a line is written whole or not
at all, so the lines after the disk is freed are not glued to a torn one (episode marks, spool
drop logs and the learner's version log are such files, read back line by line)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from foundation.durable import append_line
from tests.fakes.disk import TmpfsDisk


def test_a_line_that_does_not_fit_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    disk = TmpfsDisk(tmp_path / "disk", size="1m")
    path = disk.path / "marks.jsonl"
    try:
        append_line(path, json.dumps({"n": 0}))
        disk.fill()
        before = path.read_bytes()
        big = json.dumps({"n": 1, "pad": "x" * 64 * 1024})  # more than the last page holds
        with pytest.raises(OSError):
            append_line(path, big)
        assert path.read_bytes() == before
        disk.free()
        append_line(path, json.dumps({"n": 2}))
        assert [json.loads(x)["n"] for x in path.read_text().splitlines()] == [0, 2]
    finally:
        disk.close()
