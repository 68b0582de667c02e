"""The record of what retention deleted (``retired.jsonl``): lookups count retired rows
across a reopen, a torn last line is skipped, each line is durable before its unlink, and a
long record is folded to a line per robot that answers the same."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from buffer import ReplayBuffer
from buffer.table.retired import RETIRED_FILE, read_lines
from foundation.durable import atomic_write_text
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


ROBOTS = ("robot-0", "robot-3")


def _answers(buf: ReplayBuffer, end: int) -> dict[str, tuple[np.ndarray, np.ndarray, int | None]]:
    """Per robot: its stored seqs (retired ones too), its retired seqs, its durable seq; and
    that the retired and the kept seqs split ``[base, base + end)`` with none twice."""
    out = {}
    for r, base in zip(ROBOTS, (0, 1000), strict=True):
        stored, gone = buf.stored_seqs(r), buf.retired_seqs(r)
        kept = buf.stored_seqs(r, retired=False)
        np.testing.assert_array_equal(stored, np.arange(base, base + end))
        np.testing.assert_array_equal(np.sort(np.concatenate([gone, kept])), stored)
        assert buf.contains(r, stored).all() and not buf.contains(r, [base + end, -1]).any()
        out[r] = (stored, gone, buf.durable_seq(r))
    return out


def test_a_long_record_is_folded_and_answers_as_before(tmp_path, monkeypatch) -> None:
    """Past FOLD_LINES lines retention folds the record to one line per robot: the file stays
    within the threshold plus one deletion's lines, and the lookups answer the same in process,
    after a reopen, and as retention goes on after a fold."""
    from buffer.table import retired

    monkeypatch.setattr(retired, "FOLD_LINES", 8)
    record = tmp_path / "b" / RETIRED_FILE
    seen: list[tuple[int, int]] = []  # (the file's lines after a deletion, that deletion's)
    real_record = retired.RetiredSeqs.record

    def counted(self, segments) -> None:  # type: ignore[no-untyped-def]
        real_record(self, segments)
        seen.append((len(record.read_bytes().splitlines()), len(segments)))

    monkeypatch.setattr(retired.RetiredSeqs, "record", counted)
    with open_buffer(tmp_path / "b", **SMALL) as buf:
        _fill(buf, rounds=40)
        before = _answers(buf, 400)
    assert sum(k for _, k in seen) > 3 * 8  # without folds the file would hold them all
    assert all(n < 8 + k for n, k in seen), seen
    lines = read_lines(record)
    assert {x["first_row"] for x in lines[: len(ROBOTS)]} == {retired.FOLDED_ROW}
    with ReplayBuffer.open(tmp_path / "b", read_only=True) as ro:
        after = _answers(ro, 400)  # close sealed the tail: retention may have deleted more
        for r in ROBOTS:
            assert after[r][2] == before[r][2]
            assert np.isin(before[r][1], after[r][1]).all()
            rows = sum(x["robots"][r]["rows"] for x in lines if r in x["robots"])
            assert rows == len(after[r][1])  # a folded line keeps the robot's row count
    with open_buffer(tmp_path / "b", **SMALL) as again:  # retention goes on after the folds
        for e in range(40, 60):
            again.append(episodes(0, [10], seq0=10 * e, ep0=e))
            again.append(episodes(3, [10], seq0=1000 + 10 * e, ep0=e))
        again.flush()
        going = _answers(again, 600)
        assert np.isin(after["robot-0"][1], going["robot-0"][1]).all()
    assert all(n < 8 + k for n, k in seen), seen
    with ReplayBuffer.open(tmp_path / "b", read_only=True) as ro:
        final = _answers(ro, 600)
        assert (
            final["robot-3"][2] == 1599 and np.isin(going["robot-3"][1], final["robot-3"][1]).all()
        )


def test_a_fold_leaves_out_a_line_whose_segment_is_still_on_disk(tmp_path, monkeypatch) -> None:
    """A line recorded before a crash that kept its segment on disk is not folded in: the
    segment's rows are stored, and its deletion later records them again."""
    from buffer.table import retired

    monkeypatch.setattr(retired, "FOLD_LINES", 4)

    def seg(first: int, n: int) -> tuple[int, np.ndarray, np.ndarray]:
        return first, np.array(["a"] * (n // 2) + ["b"] * (n // 2)), np.arange(first, first + n)

    rec = retired.RetiredSeqs(tmp_path, read_only=False)
    rec.record([seg(0, 10), seg(10, 10), seg(20, 10)])
    again = retired.RetiredSeqs(tmp_path, read_only=False)
    again.load({20})  # a crash came before the unlink of the segment at row 20
    assert not again.fold()  # three lines: not yet
    again.record([seg(30, 10)])
    assert again.fold()
    lines = read_lines(tmp_path / RETIRED_FILE)
    assert [(x["first_row"], list(x["robots"])) for x in lines] == [(-1, ["a"]), (-1, ["b"])]
    assert lines[0]["robots"]["a"] == {"rows": 15, "seqs": [[0, 4], [10, 14], [30, 34]]}
    ro = retired.RetiredSeqs(tmp_path, read_only=True)
    ro.load(set())
    np.testing.assert_array_equal(ro.seqs("a"), np.r_[0:5, 10:15, 30:35])
    assert ro.last("b") == 39 and not ro.contains("b", np.array([25, 40])).any()


def test_a_fold_that_cannot_be_written_leaves_the_record_whole(tmp_path, monkeypatch) -> None:
    from buffer.table import retired

    def full(path, text) -> None:  # type: ignore[no-untyped-def]
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(retired, "FOLD_LINES", 4)
    with open_buffer(tmp_path / "b", **SMALL) as buf:
        monkeypatch.setattr(retired, "atomic_write_text", full)
        _fill(buf, rounds=20)
        lines = len(read_lines(tmp_path / "b" / RETIRED_FILE))
        assert lines > 4  # retention went on, one line a segment
        monkeypatch.setattr(retired, "atomic_write_text", atomic_write_text)
        buf.append(episodes(0, [10] * 3, seq0=200, ep0=20))
        buf.flush()
        assert len(read_lines(tmp_path / "b" / RETIRED_FILE)) < lines
        np.testing.assert_array_equal(buf.stored_seqs("robot-0"), np.arange(230))
    with ReplayBuffer.open(tmp_path / "b", read_only=True) as ro:
        np.testing.assert_array_equal(ro.stored_seqs("robot-0"), np.arange(230))
        np.testing.assert_array_equal(ro.stored_seqs("robot-3"), np.arange(1000, 1200))


def test_a_segment_whose_unlink_failed_is_not_folded_into_the_record(tmp_path, monkeypatch) -> None:
    """An unlink that fails (a busy or read-only file) leaves the segment on disk: retention
    tries it again at the next deletion and folds the record only once it is gone, so a
    reopen never counts the rows of a segment it finds on disk as retired too."""
    from buffer.table import retention, retired

    monkeypatch.setattr(retired, "FOLD_LINES", 4)
    real_unlink = os.unlink
    refused: list[str] = []

    def unlink(path, *a, **kw) -> None:  # type: ignore[no-untyped-def]
        # The first sealed segment file retention deletes, refused five times.
        segment = os.path.basename(str(path)).startswith("seg-")
        if segment and (not refused or str(path) == refused[0]) and len(refused) < 5:
            refused.append(str(path))
            raise OSError(16, "Device or resource busy")
        real_unlink(path, *a, **kw)

    monkeypatch.setattr(retention.os, "unlink", unlink)
    with open_buffer(tmp_path / "b", **SMALL) as buf:
        _fill(buf, rounds=20)
        assert len(refused) >= 2  # the first file, refused and tried again
        monkeypatch.setattr(retention.os, "unlink", real_unlink)
        buf.append(episodes(0, [10] * 3, seq0=200, ep0=20))
        buf.flush()
        assert not os.path.exists(refused[0])  # deleted at a later deletion
        np.testing.assert_array_equal(buf.stored_seqs("robot-0"), np.arange(230))
    with ReplayBuffer.open(tmp_path / "b", read_only=True) as ro:
        for r, seqs in (("robot-0", np.arange(230)), ("robot-3", np.arange(1000, 1200))):
            gone, kept = ro.retired_seqs(r), ro.stored_seqs(r, retired=False)
            assert np.intersect1d(gone, kept).size == 0  # no row counted twice
            np.testing.assert_array_equal(np.sort(np.concatenate([gone, kept])), seqs)
