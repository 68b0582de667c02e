"""Format versions: files of another version are refused on open, torn ones still dropped."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from buffer import FORMAT_VERSION, ReplayBuffer, UnsupportedFormatError
from buffer.files.format import SEGMENT_VERSION_KEY, SUPPORTED_FORMAT_VERSIONS
from buffer.files.sealed import list_sealed
from buffer.files.segments import list_segments, write_segment
from buffer.files.wal import FILE_MAGIC
from tests.buffer.helpers import episodes, open_buffer


def _crashed(path: Path, n: int = 6) -> Path:
    """A buffer that acknowledged ``n`` steps into its one WAL file, then 'crashed'."""
    buf = open_buffer(path, segment_target_bytes=10**9, wal_stripes=1)
    buf.append(episodes(0, [n]))
    log = buf.writer.wal.logs[0]  # noqa: SLF001 - abandon it like a killed process would
    wal = log.path
    os.close(log._fd)  # noqa: SLF001
    log._fd = -1  # noqa: SLF001
    buf.state.closed = True  # noqa: SLF001
    buf.state.stop.set()  # noqa: SLF001
    os.close(buf._lock_fd)  # noqa: SLF001
    return wal


def _set_marker(wal: Path, marker: bytes) -> bytes:
    data = wal.read_bytes()
    wal.write_bytes(marker + data[len(marker) :])
    return data


@pytest.mark.parametrize(
    ("marker", "found"),
    [(b"RFWAL003", "version 003"), (b"PAR1\x00\x01zz", "not a robofleet WAL")],
)
def test_wal_of_another_version_is_refused_and_kept(tmp_path, marker, found) -> None:
    wal = _crashed(tmp_path / "b")
    original = _set_marker(wal, marker)
    changed = wal.read_bytes()
    for read_only in (False, True):
        with pytest.raises(UnsupportedFormatError) as err:
            ReplayBuffer.open(tmp_path / "b", read_only=read_only)
        msg = str(err.value)
        assert str(wal) in msg and found in msg and "version(s) 1, 2" in msg
        assert err.value.path == wal and err.value.supported == SUPPORTED_FORMAT_VERSIONS
    assert wal.read_bytes() == changed  # nothing dropped, truncated or deleted
    wal.write_bytes(original)  # with the marker back, every acknowledged step is there
    with ReplayBuffer.open(tmp_path / "b") as buf:  # the refused open left no lock behind
        assert buf.durable_seq("robot-0") == 5 and buf.num_steps == 6


@pytest.mark.parametrize("header", [b"", b"RFW", b"\x00" * 16])
def test_wal_whose_header_was_never_written_is_dropped_as_torn(tmp_path, header) -> None:
    _crashed(tmp_path / "b")
    with ReplayBuffer.open(tmp_path / "b") as buf:  # seal the acknowledged rows first
        assert buf.num_steps == 6
    for w in (tmp_path / "b").glob("wal-*.log"):
        w.unlink()
    (tmp_path / "b" / "wal-0000000000000006-00.log").write_bytes(header)
    with ReplayBuffer.open(tmp_path / "b") as buf:
        assert buf.num_steps == 6
        buf.append(episodes(0, [2], seq0=6, ep0=1))
        assert buf.durable_seq("robot-0") == 7


def test_torn_record_tail_is_still_dropped(tmp_path) -> None:
    wal = _crashed(tmp_path / "b")
    assert wal.read_bytes().startswith(FILE_MAGIC)
    with open(wal, "ab") as f:
        f.write(b"\x4c\x57\x46\x52half a record")  # record magic, then nothing valid
    with ReplayBuffer.open(tmp_path / "b") as buf:
        assert buf.torn_bytes_dropped > 0 and buf.num_steps == 6


def _rewrite_segment(path: Path, metadata: dict[bytes, bytes] | None) -> None:
    batch = ipc.open_file(pa.py_buffer(path.read_bytes())).get_batch(0)  # not a map of path
    batch = batch.replace_schema_metadata(metadata)
    with pa.OSFile(str(path), "wb") as sink, ipc.new_file(sink, batch.schema) as writer:
        writer.write_batch(batch)


def test_version_1_wal_is_still_replayed(tmp_path) -> None:
    """A version-1 WAL (same record layout) left by a crash is replayed and sealed."""
    wal = _crashed(tmp_path / "b")
    _set_marker(wal, b"RFWAL001")
    with ReplayBuffer.open(tmp_path / "b") as buf:
        assert buf.durable_seq("robot-0") == 5 and buf.num_steps == 6
    assert FORMAT_VERSION == 2 and list_sealed(tmp_path / "b")


def _legacy_directory(path: Path) -> tuple[Path, pa.RecordBatch]:
    """A directory holding one version-1 Arrow segment of 5 steps (rows 0..4) and no WAL."""
    with open_buffer(path) as buf:
        batch = buf.schema.validate(buf.schema.batch_from_records(episodes(0, [5])))
    for p in path.glob("wal-*.log"):
        p.unlink()
    return write_segment(path, 0, batch), batch


def test_segment_version_is_written_checked_and_legacy_read(tmp_path) -> None:
    seg, _ = _legacy_directory(tmp_path / "b")
    assert list_segments(tmp_path / "b")
    meta = dict(ipc.open_file(pa.py_buffer(seg.read_bytes())).schema.metadata)
    assert meta[SEGMENT_VERSION_KEY] == str(FORMAT_VERSION).encode()
    with ReplayBuffer.open(tmp_path / "b") as buf:  # Arrow segments are still read
        assert buf.durable_seq("robot-0") == 4
        buf.append(episodes(0, [3], seq0=5, ep0=1))  # new rows go to a sealed WAL segment
    with ReplayBuffer.open(tmp_path / "b") as buf:
        assert buf.stored_seqs("robot-0").tolist() == list(range(8))

    _rewrite_segment(seg, {k: v for k, v in meta.items() if k != SEGMENT_VERSION_KEY})
    with ReplayBuffer.open(tmp_path / "b") as buf:  # written before the key existed: v1
        assert buf.durable_seq("robot-0") == 7

    _rewrite_segment(seg, {**meta, SEGMENT_VERSION_KEY: b"7"})
    with pytest.raises(UnsupportedFormatError, match=r"version 7 is not supported") as err:
        ReplayBuffer.open(tmp_path / "b")
    assert str(seg) in str(err.value) and err.value.path == seg
    assert seg.exists()
