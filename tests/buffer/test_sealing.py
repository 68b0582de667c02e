"""Format 2 sealing: the WAL files become the segment (each byte written once); close()
seals the tail; an interrupted seal is finished on open; a damaged segment is refused."""

from __future__ import annotations

import os
import time
import zlib

import numpy as np
import pytest

from buffer import ReplayBuffer
from buffer.errors import CorruptDataError
from buffer.files.sealed import list_sealed, sealed_name
from buffer.files.wal import list_wals, record_header, scan_wal
from tests.buffer.helpers import episodes, obs_value, open_buffer


def _states(buf: ReplayBuffer) -> dict[tuple[str, int], float]:
    rows = np.arange(buf.first_row, buf.visible, dtype=np.int64)
    data = buf.storage.gather(rows, ["observation.state"], count=False)["observation.state"]
    robots = np.asarray(buf.index.robots.names)[buf.index.view("robot")]
    return {
        (str(r), int(s)): float(v)
        for r, s, v in zip(robots, buf.index.view("seq"), data[:, 0], strict=True)
    }


def _abandon(buf: ReplayBuffer) -> None:
    """Leave the buffer like a killed process would: files as they are, lock released."""
    buf.state.stop.set()  # noqa: SLF001
    for log in buf.writer.wal.logs:  # noqa: SLF001
        os.close(log._fd)  # noqa: SLF001
        log._fd = -1  # noqa: SLF001
    buf.state.closed = True  # noqa: SLF001
    os.close(buf._lock_fd)  # noqa: SLF001


def test_seal_renames_the_wal_file_instead_of_copying_it(tmp_path) -> None:
    d = tmp_path / "b"
    with open_buffer(d, segment_target_bytes=3000, wal_stripes=1) as buf:
        first_wal = buf.writer.wal.logs[0].path  # noqa: SLF001
        inode = first_wal.stat().st_ino
        size_before = 0
        seq = 0
        while first_wal.exists():  # append until the tail rotates and its WAL is sealed
            size_before = first_wal.stat().st_size
            buf.append(episodes(0, [4], seq0=seq, ep0=seq // 4))
            seq += 4
            buf.flush()
        (first, rows), paths = next(iter(sorted(list_sealed(d).items())))
        assert first == 0 and rows > 0 and len(paths) == 1
        # Same inode: the segment IS the WAL file; nothing was copied.
        assert paths[0].stat().st_ino == inode
        assert paths[0].stat().st_size >= size_before
        before = _states(buf)
    with ReplayBuffer.open(d) as again:
        assert _states(again) == before
        assert again.stored_seqs("robot-0").tolist() == list(range(seq))


def test_close_seals_the_tail_so_reopen_replays_nothing(tmp_path) -> None:
    d = tmp_path / "b"
    recs = episodes(0, [5, 7]) + episodes(1, [6])
    with open_buffer(d, segment_target_bytes=10**9) as buf:
        buf.append(recs[:12])
        buf.append(recs[12:])
        before = _states(buf)
    assert list(list_wals(d)) == []  # nothing left to replay
    assert sum(rows for _, rows in list_sealed(d)) == len(recs)
    with ReplayBuffer.open(d) as again:
        assert again.recovered_rows == 0 and again.torn_bytes_dropped == 0
        assert _states(again) == before
        assert again.num_steps == len(recs)
        again.append(episodes(0, [2], seq0=12, ep0=2))  # continues after the sealed rows
    with ReplayBuffer.open(d) as third:
        assert third.num_steps == len(recs) + 2
        assert third.durable_seq("robot-0") == 13


def test_close_of_an_empty_tail_leaves_no_files(tmp_path) -> None:
    d = tmp_path / "b"
    open_buffer(d).close()
    assert list(list_wals(d)) == [] and list_sealed(d) == {}
    with ReplayBuffer.open(d) as buf:
        assert buf.num_steps == 0


def _two_stripes() -> tuple[int, int]:
    by_stripe: dict[int, int] = {}
    for r in range(20):
        by_stripe.setdefault(zlib.crc32(f"robot-{r}".encode()) % 4, r)
    a, b = list(by_stripe.values())[:2]
    return a, b


def test_interrupted_seal_is_finished_on_open(tmp_path) -> None:
    """A crash between the renames of one seal: some stripes sealed, some still WAL."""
    d = tmp_path / "b"
    a, b = _two_stripes()
    buf = open_buffer(d, segment_target_bytes=10**9, wal_stripes=4)
    buf.append(episodes(a, [4]))
    buf.append(episodes(b, [5]))
    buf.append(episodes(a, [3], seq0=4, ep0=1))
    paths = [log.path for log in buf.writer.wal.logs if log.path.stat().st_size > 16]  # noqa: SLF001
    _abandon(buf)
    assert len(paths) == 2
    stripe = int(paths[0].stem.split("-")[2])
    os.rename(paths[0], d / sealed_name(0, 12, stripe))  # the first rename happened, no more
    with ReplayBuffer.open(d) as again:
        assert again.num_steps == 12
        assert again.stored_seqs(f"robot-{a}").tolist() == list(range(7))
        assert again.stored_seqs(f"robot-{b}").tolist() == list(range(5))
        got = _states(again)
        assert got[(f"robot-{b}", 3)] == obs_value(b, 3)
    assert list(list_wals(d)) == []
    assert [len(p) for p in list_sealed(d).values()] == [2]


def test_sealed_segment_with_a_missing_stripe_is_refused(tmp_path) -> None:
    d = tmp_path / "b"
    a, b = _two_stripes()
    with open_buffer(d, segment_target_bytes=10**9, wal_stripes=4) as buf:
        buf.append(episodes(a, [4]))
        buf.append(episodes(b, [5]))
    (key, files), *_ = list_sealed(d).items()
    assert key == (0, 9) and len(files) == 2
    files[1].unlink()
    with pytest.raises(CorruptDataError, match="tile|name says"):
        ReplayBuffer.open(d)


def test_record_after_a_gap_written_before_a_kept_one_is_dropped(tmp_path) -> None:
    """Appends write their WAL records outside the buffer lock, so a file can hold rows 8..11
    before rows 0..3. If rows 4..7 never became durable, recovery keeps 0..3 only, and the
    segment it seals must not carry the orphaned record (the file is rewritten)."""
    d = tmp_path / "b"
    buf = open_buffer(d, segment_target_bytes=10**9, wal_stripes=1)
    recs = episodes(0, [12])
    for i in range(0, 12, 4):
        buf.append(recs[i : i + 4])
    path = buf.writer.wal.logs[0].path  # noqa: SLF001
    _abandon(buf)
    scan = scan_wal(path)
    a, _b, c = scan.records
    head = path.read_bytes()[:16]
    body = b"".join(record_header(r.first_row, r.payload) + r.payload for r in (c, a))
    path.write_bytes(head + body)  # C, then A; B lost
    with ReplayBuffer.open(d) as again:
        assert again.stored_seqs("robot-0").tolist() == [0, 1, 2, 3]
        assert _states(again)[("robot-0", 2)] == obs_value(0, 2)
        again.append(recs[4:8])
    with ReplayBuffer.open(d) as third:
        assert third.stored_seqs("robot-0").tolist() == list(range(8))


def test_a_failing_seal_refuses_appends_by_name_then_heals_without_losing_a_row(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A seal that fails (here ENOSPC on its rename) is retried; an append that would have to
    wait for it is refused (DiskFullError) instead of hanging, and nothing it refused is
    stored; once a seal works, appends go on and every acknowledged row is there."""
    import errno
    import threading

    from buffer import DiskFullError
    from buffer.table import sealer as sealer_mod

    monkeypatch.setattr(sealer_mod, "RETRY_S", 0.05)
    real_seal_files = sealer_mod.seal_files
    broken = threading.Event()
    broken.set()

    def seal_files(*args, **kwargs):  # type: ignore[no-untyped-def]
        if broken.is_set():
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_seal_files(*args, **kwargs)

    monkeypatch.setattr(sealer_mod, "seal_files", seal_files)
    d = tmp_path / "b"
    with open_buffer(d, segment_target_bytes=3000, wal_stripes=1) as buf:
        acked: list[int] = []
        refused = None
        seq = 0
        for _ in range(200):  # until a rotation needs the failed seal
            try:
                buf.append(episodes(0, [4], seq0=seq, ep0=seq // 4))
            except DiskFullError as exc:
                refused = exc
                break
            acked.extend(range(seq, seq + 4))
            seq += 4
        assert refused is not None, "appends never needed the failing seal"
        assert "disk full" in str(refused) and "retry" in str(refused)
        assert buf.sealer.failed is not None  # noqa: SLF001
        with pytest.raises(OSError, match="sealing is failing"):
            buf.flush()
        assert buf.stored_seqs("robot-0").tolist() == acked  # the refused batch left nothing
        broken.clear()  # space is back: the retried seal succeeds
        deadline = time.monotonic() + 10
        while buf.sealer.failed is not None and time.monotonic() < deadline:  # noqa: SLF001
            time.sleep(0.02)
        assert buf.sealer.failed is None  # noqa: SLF001
        buf.append(episodes(0, [4], seq0=seq, ep0=seq // 4))  # the refused batch, again
        acked.extend(range(seq, seq + 4))
        buf.flush()
        assert list_sealed(d)
        assert buf.stored_seqs("robot-0").tolist() == acked
    with ReplayBuffer.open(d) as again:
        assert again.stored_seqs("robot-0").tolist() == acked


def test_sealing_again_after_a_partial_rename_keeps_every_file(tmp_path) -> None:
    from buffer.files.sealed import seal_files
    from buffer.files.wal import FILE_HEADER_BYTES, wal_name

    paths = [tmp_path / wal_name(0, k) for k in range(3)]
    for p in paths:
        p.write_bytes(b"\0" * (FILE_HEADER_BYTES + 10))
    first = tmp_path / sealed_name(0, 40, 0)
    os.replace(paths[0], first)  # a try that failed after its first rename
    out = seal_files(tmp_path, 0, 40, paths)
    assert out == sorted([first, *(tmp_path / sealed_name(0, 40, k) for k in (1, 2))])
    assert all(p.exists() for p in out) and not any(p.exists() for p in paths)
