"""The record of what retention deleted (``retired.jsonl``): lookups count retired rows
across a reopen, a torn last line is skipped, and each line is durable before its unlink."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from buffer import ReplayBuffer
from buffer.table.retired import RETIRED_FILE
from tests.buffer.helpers import episodes, open_buffer

SMALL = {"segment_target_bytes": 1300, "retention_max_bytes": 6000}


def _fill(buf: ReplayBuffer, rounds: int = 15) -> None:
    """Two robots, 10 steps each a round, their seqs from 0 (robot 0) and 1000 (robot 3)."""
    for e in range(rounds):
        buf.append(episodes(0, [10], seq0=10 * e, ep0=e))
        buf.append(episodes(3, [10], seq0=1000 + 10 * e, ep0=e))
    buf.flush()


def test_retired_seqs_still_count_after_a_reopen(tmp_path) -> None:
    with open_buffer(tmp_path / "b", **SMALL) as buf:
        _fill(buf)
        assert buf.first_row > 0  # retention deleted segments
        retired0 = buf.retired_seqs("robot-0")
        assert len(retired0) > 0 and len(buf.retired_seqs("robot-3")) > 0
        in_process = {r: buf.stored_seqs(r) for r in ("robot-0", "robot-3")}
        on_disk = buf.stored_seqs("robot-0", retired=False)
        assert np.intersect1d(on_disk, retired0).size == 0
    np.testing.assert_array_equal(in_process["robot-0"], np.arange(150))
    np.testing.assert_array_equal(in_process["robot-3"], np.arange(1000, 1150))
    with ReplayBuffer.open(tmp_path / "b") as again:
        for r, seqs in in_process.items():
            assert again.contains(r, seqs).all()
            np.testing.assert_array_equal(again.stored_seqs(r), seqs)
        assert again.durable_seq("robot-0") == 149 and again.durable_seq("robot-3") == 1149
        # close sealed the open tail, and retention may have deleted more then
        gone, kept = again.retired_seqs("robot-0"), again.stored_seqs("robot-0", retired=False)
        assert np.isin(retired0, gone).all() and np.isin(kept, on_disk).all()
        np.testing.assert_array_equal(np.concatenate([gone, kept]), np.arange(150))
        assert not again.contains("robot-0", [150, -1, 1000]).any()
        # retention goes on after the reopen: the record's runs and the index's rows join
        _fill_more = episodes(0, [10] * 20, seq0=150, ep0=15)
        again.append(_fill_more)
        again.flush()
        np.testing.assert_array_equal(again.stored_seqs("robot-0"), np.arange(350))
        assert len(again.retired_seqs("robot-0")) > len(retired0)
    with ReplayBuffer.open(tmp_path / "b", read_only=True) as ro:
        assert ro.contains("robot-0", np.arange(350)).all()
    lines = (tmp_path / "b" / RETIRED_FILE).read_text().splitlines()
    first = json.loads(lines[0])
    assert first["first_row"] == 0 and first["rows"] > 0
    assert sum(v["rows"] for v in first["robots"].values()) == first["rows"]


def test_a_torn_last_line_is_skipped_and_cut(tmp_path) -> None:
    with open_buffer(tmp_path / "b", **SMALL) as buf:
        _fill(buf)
        retired = buf.retired_seqs("robot-3")
    record = tmp_path / "b" / RETIRED_FILE
    whole = record.read_bytes()
    torn = b'{"first_row":999999,"rows":5,"robots":{"robot-3":{"rows":5,"seqs":[[5000,50'
    record.write_bytes(whole + torn)
    with ReplayBuffer.open(tmp_path / "b", read_only=True) as ro:  # skipped, file untouched
        np.testing.assert_array_equal(ro.retired_seqs("robot-3"), retired)
        assert not ro.contains("robot-3", [5000]).any()
    assert record.read_bytes() == whole + torn
    with ReplayBuffer.open(tmp_path / "b") as again:  # cut, so the next line starts clean
        np.testing.assert_array_equal(again.retired_seqs("robot-3"), retired)
    assert record.read_bytes() == whole


def test_each_line_is_fsynced_before_its_segment_is_unlinked(tmp_path, monkeypatch) -> None:
    """At every unlink of a segment file, the record's fsynced bytes name that segment."""
    record = tmp_path / "b" / RETIRED_FILE
    synced = [b""]  # the record as of its last fsync
    checked: list[int] = []
    unrecorded: list[str] = []  # asserted after: the unlinks run in the sealer's thread
    real_fsync, real_unlink = os.fsync, os.unlink

    def fsync(fd: int) -> None:
        real_fsync(fd)
        if os.readlink(f"/proc/self/fd/{fd}") == str(record):
            synced[0] = record.read_bytes()

    def unlink(path, *a, **kw) -> None:  # type: ignore[no-untyped-def]
        name = os.path.basename(str(path))
        if name.startswith("seg-"):
            first = int(name.split("-")[1])
            lines = [json.loads(x) for x in synced[0].decode().splitlines()]
            if first not in {x["first_row"] for x in lines}:
                unrecorded.append(name)
            checked.append(first)
        real_unlink(path, *a, **kw)

    with open_buffer(tmp_path / "b", **SMALL) as buf:
        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "unlink", unlink)
        _fill(buf)
        monkeypatch.undo()
    assert len(set(checked)) >= 2 and unrecorded == []


def test_a_record_that_cannot_be_written_deletes_nothing(tmp_path, monkeypatch) -> None:
    from buffer.table import retired

    def full(path, line) -> None:  # type: ignore[no-untyped-def]
        raise OSError(28, "No space left on device")

    with open_buffer(tmp_path / "b", **SMALL) as buf:
        monkeypatch.setattr(retired, "append_line", full)
        _fill(buf)
        assert buf.first_row == 0 and len(buf.retired_seqs("robot-0")) == 0
        assert not (tmp_path / "b" / RETIRED_FILE).exists()
        monkeypatch.undo()
        buf.append(episodes(0, [10], seq0=150, ep0=15))  # the next seal retires them all
        buf.flush()
        assert buf.first_row > 0
        np.testing.assert_array_equal(buf.stored_seqs("robot-0"), np.arange(160))
    with ReplayBuffer.open(tmp_path / "b") as again:
        np.testing.assert_array_equal(again.stored_seqs("robot-0"), np.arange(160))


@pytest.mark.parametrize("line", [b"not json\n", b'{"first_row": 1}\n'])
def test_a_bad_line_before_the_last_is_corrupt(tmp_path, line) -> None:
    from buffer.errors import CorruptDataError

    with open_buffer(tmp_path / "b", **SMALL) as buf:
        _fill(buf)
    record = tmp_path / "b" / RETIRED_FILE
    record.write_bytes(line + record.read_bytes())
    with pytest.raises(CorruptDataError, match="line 1"):
        ReplayBuffer.open(tmp_path / "b", read_only=True)


_KILLED_AT_UNLINK = """
import os, signal, sys
sys.path.insert(0, {root!r})
from tests.buffer.helpers import episodes, open_buffer
real = os.unlink
def unlink(path, *a, **kw):
    if os.path.basename(str(path)).startswith("seg-"):
        os.kill(os.getpid(), signal.SIGKILL)  # the line is fsynced, the file not yet unlinked
    real(path, *a, **kw)
buf = open_buffer({path!r}, segment_target_bytes=1300, retention_max_bytes=6000)
os.unlink = unlink
for e in range(15):
    buf.append(episodes(0, [10], seq0=10 * e, ep0=e))
"""


def test_a_kill_between_the_line_and_the_unlink_keeps_the_segment_stored(tmp_path) -> None:
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    code = _KILLED_AT_UNLINK.format(root=root, path=str(tmp_path / "b"))
    proc = subprocess.run([sys.executable, "-c", code], timeout=120, capture_output=True)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    lines = (tmp_path / "b" / RETIRED_FILE).read_text().splitlines()
    assert len(lines) >= 1  # recorded, and its segment still on disk
    with ReplayBuffer.open(tmp_path / "b", read_only=True) as ro:
        on_disk = ro.stored_seqs("robot-0", retired=False)
        recorded = [json.loads(x)["first_row"] for x in lines]
        assert ro.sealed_segments[0][0] in recorded  # the recorded segment is still there
        assert not np.isin(ro.retired_seqs("robot-0"), on_disk).any()  # not counted retired
        assert ro.contains("robot-0", on_disk).all()
    with open_buffer(tmp_path / "b", **SMALL) as again:  # retention deletes it again
        seqs = again.stored_seqs("robot-0")
        gone = again.retired_seqs("robot-0")
        assert np.isin(on_disk[:5], gone).all()
    with ReplayBuffer.open(tmp_path / "b", read_only=True) as ro:
        np.testing.assert_array_equal(ro.stored_seqs("robot-0"), seqs)
        np.testing.assert_array_equal(seqs, np.arange(len(seqs)))
