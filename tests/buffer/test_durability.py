"""WAL, sealing, recovery and index rebuild; SIGKILL of a real buffer process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from buffer import ReplayBuffer
from buffer.bench.crash import check
from buffer.files.sealed import list_sealed
from buffer.files.wal import list_wals, scan_wal
from tests.buffer.helpers import episodes, obs_value, open_buffer


def _contents(buf: ReplayBuffer) -> dict[tuple[str, int], float]:
    rows = np.arange(buf.first_row, buf.visible, dtype=np.int64)
    data = buf.storage.gather(rows, ["observation.state"], count=False)
    robots = np.asarray(buf.index.robots.names)[buf.index.view("robot")]
    seqs = buf.index.view("seq")
    return {
        (str(r), int(s)): float(v)
        for r, s, v in zip(robots, seqs, data["observation.state"][:, 0], strict=True)
    }


def test_reopen_keeps_everything_and_seals(tmp_path) -> None:
    recs = episodes(0, [7, 9, 11]) + episodes(1, [20])
    with open_buffer(tmp_path / "b", segment_target_bytes=1500) as buf:
        for i in range(0, len(recs), 5):
            buf.append(recs[i : i + 5])
        buf.flush()
        before = _contents(buf)
        n = len(buf)
    assert len(list_sealed(tmp_path / "b")) >= 2
    with ReplayBuffer.open(tmp_path / "b") as again:  # no schema: the stored one
        assert _contents(again) == before
        assert len(again) == n
        assert again.num_steps == len(recs)


def test_torn_wal_tail_is_dropped_nothing_complete_lost(tmp_path) -> None:
    recs = episodes(0, [30])
    big = open_buffer(tmp_path / "b", segment_target_bytes=10**9, wal_stripes=1)
    acked = 0
    for i in range(0, 30, 3):
        acked = big.append(recs[i : i + 3]).acked["robot-0"]
    log = big.writer.wal.logs[0]  # noqa: SLF001 - simulate the crash on this exact file
    wal = log.path
    os.close(log._fd)  # noqa: SLF001
    log._fd = -1  # noqa: SLF001
    big.state.closed = True  # noqa: SLF001 - abandon it like a crashed process would
    os.close(big._lock_fd)  # noqa: SLF001
    size = wal.stat().st_size
    scan = scan_wal(wal)
    assert len(scan.records) == 10 and not scan.torn
    # Tear the last record in half, and append garbage.
    with open(wal, "r+b") as f:
        f.truncate(size - 40)
        f.seek(0, 2)
        f.write(b"\x00garbage")
    with ReplayBuffer.open(tmp_path / "b") as buf:
        assert buf.torn_bytes_dropped > 0
        seqs = sorted(buf.index.view("seq").tolist())
        assert seqs == list(range(27))  # the torn record (seq 27..29) was never complete
        assert list(list_wals(tmp_path / "b"))[0][0] == 27  # fresh WAL continues at row 27
        buf.append(recs[27:])
        assert buf.num_steps == 30
    assert acked == 29


def test_corrupt_record_checksum_stops_replay(tmp_path) -> None:
    recs = episodes(0, [12])
    buf = open_buffer(tmp_path / "b", segment_target_bytes=10**9, wal_stripes=1)
    for i in range(0, 12, 4):
        buf.append(recs[i : i + 4])
    wal = buf.writer.wal.logs[0].path  # noqa: SLF001
    buf.state.stop.set()  # noqa: SLF001
    os.close(buf._lock_fd)  # noqa: SLF001
    scan = scan_wal(wal)
    data = bytearray(wal.read_bytes())
    flip = scan.good_bytes - 10  # inside the last record's payload
    data[flip] ^= 0xFF
    wal.write_bytes(bytes(data))
    assert len(scan_wal(wal).records) == 2
    with ReplayBuffer.open(tmp_path / "b") as again:
        assert again.num_steps == 8


def test_striped_wal_keeps_only_the_contiguous_prefix(tmp_path) -> None:
    """Rows after a lost record of another stripe were never acknowledged: dropped."""
    import zlib

    stripes = 4
    by_stripe: dict[int, int] = {}
    for r in range(20):
        by_stripe.setdefault(zlib.crc32(f"robot-{r}".encode()) % stripes, r)
    a, b = list(by_stripe.values())[:2]  # two robots on different stripes
    buf = open_buffer(tmp_path / "b", segment_target_bytes=10**9, wal_stripes=stripes)
    buf.append(episodes(a, [4]))  # rows 0..3, stripe of a
    buf.append(episodes(b, [4]))  # rows 4..7, stripe of b
    buf.append(episodes(a, [4], seq0=4, ep0=1))  # rows 8..11, stripe of a
    paths = {log.stripe: log.path for log in buf.writer.wal.logs}  # noqa: SLF001
    buf.state.stop.set()  # noqa: SLF001
    os.close(buf._lock_fd)  # noqa: SLF001
    # Lose robot b's record (rows 4..7), as if its fdatasync never happened.
    sb = zlib.crc32(f"robot-{b}".encode()) % stripes
    with open(paths[sb], "r+b") as f:
        f.truncate(16)
    with ReplayBuffer.open(tmp_path / "b") as again:
        assert again.num_steps == 4
        assert sorted(again.index.view("seq").tolist()) == [0, 1, 2, 3]


def test_index_rebuilds_from_segments_alone(tmp_path) -> None:
    recs = episodes(0, [5, 6], intervention=True) + episodes(1, [4], task="push", policy_version=3)
    with open_buffer(tmp_path / "b") as buf:
        buf.append(recs)
        summary = buf.index_summary()
    ReplayBuffer.open(tmp_path / "b").close()  # recovery seals the WAL's rows
    for _, p in list_wals(tmp_path / "b"):
        assert scan_wal(p).records == []  # everything lives in segments now
        p.unlink()
    with ReplayBuffer.open(tmp_path / "b") as again:
        rebuilt = again.index_summary()
    for key in (
        "rows",
        "transitions",
        "episodes",
        "robots",
        "tasks",
        "policy_versions",
        "interventions",
    ):
        assert rebuilt[key] == summary[key], key
    assert [s["num_rows"] for s in rebuilt["segments"]] == [15]
    assert summary["episodes"] == 3
    assert summary["tasks"] == {"reach": 11, "push": 4}
    assert summary["interventions"] == 11


def test_crash_between_seal_and_wal_delete_stores_once(tmp_path) -> None:
    recs = episodes(0, [10])
    buf = open_buffer(tmp_path / "b", segment_target_bytes=10**9, wal_stripes=1)
    buf.append(recs)
    wal = buf.writer.wal.logs[0].path  # noqa: SLF001
    copy = wal.read_bytes()
    buf.close()  # the seal on reopen... simulate: recover once (seals WAL rows), then restore WAL
    with ReplayBuffer.open(tmp_path / "b") as b2:
        assert b2.num_steps == 10
    wal.write_bytes(copy)  # the WAL file "survived" the seal, as after a crash at that moment
    with ReplayBuffer.open(tmp_path / "b") as b3:
        assert b3.num_steps == 10
        assert sorted(b3.index.view("seq").tolist()) == list(range(10))
    assert not wal.exists()


def test_tmp_files_of_interrupted_seal_are_removed(tmp_path) -> None:
    with open_buffer(tmp_path / "b") as buf:
        buf.append(episodes(0, [3]))
    junk = tmp_path / "b" / "seg-0000000000000003-0000000005.arrow.tmp"
    junk.write_bytes(b"half a segment")
    with ReplayBuffer.open(tmp_path / "b") as again:
        assert again.num_steps == 3
    assert not junk.exists()


def test_second_writer_is_refused_and_schema_mismatch(tmp_path) -> None:
    from buffer import StepSchema
    from tests.buffer.helpers import small_schema

    with open_buffer(tmp_path / "b"):
        with pytest.raises(BlockingIOError):
            open_buffer(tmp_path / "b")
    other = StepSchema.from_features(
        {"observation.state": {"dtype": "float32", "shape": (9,)}},
        {"action": {"dtype": "float32", "shape": (2,)}},
    )
    with pytest.raises(ValueError, match="differs"):
        ReplayBuffer.open(tmp_path / "b", other)
    with pytest.raises(ValueError, match="no stored schema"):
        ReplayBuffer.open(tmp_path / "new")
    assert small_schema().same_columns(ReplayBuffer.open(tmp_path / "b", read_only=True).schema)


def _spawn(args: list[str], **kw) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "buffer.bench.crash_worker", *args], text=True, **kw
    )


@pytest.mark.slow
def test_sigkill_real_buffer_process_loses_no_acked_step(tmp_path: Path) -> None:
    """A buffer server process is SIGKILLed mid-stream three times; every step a writer
    process had acknowledged is stored after restart, none twice."""
    data, sock, acks = tmp_path / "buf", tmp_path / "s.sock", tmp_path / "acks"
    acks.mkdir()

    def start() -> tuple[subprocess.Popen[str], dict]:
        p = _spawn(["server", str(data), str(sock)], stdout=subprocess.PIPE)
        assert p.stdout is not None
        return p, json.loads(p.stdout.readline())

    server, _ = start()
    writers = [
        _spawn(["writer", str(sock), f"robot-{i}", str(acks / f"robot-{i}.acks")]) for i in range(2)
    ]

    def acked() -> dict[str, int]:
        out = {}
        for f in acks.glob("*.acks"):
            lines = f.read_text().split()
            out[f.stem] = int(lines[-1]) if lines else -1
        return out

    try:
        for _ in range(3):
            before = sum(acked().values())
            deadline = time.monotonic() + 60
            while sum(acked().values()) < before + 40 and time.monotonic() < deadline:
                time.sleep(0.02)
            os.kill(server.pid, signal.SIGKILL)
            server.wait()
            snapshot = acked()
            assert sum(snapshot.values()) > before  # writers really were streaming
            server, ready = start()
            lost, dups = check(snapshot, ready["robots"])
            assert (lost, dups) == (0, 0)
    finally:
        for w in writers:
            w.kill()
            w.wait()
        server.kill()
        server.wait()
    with ReplayBuffer.open(data) as buf:
        final = acked()
        lost, dups = check(
            final,
            {
                name: {"runs": [[0, int(buf.index.last_seq(name) or -1)]], "duplicates": 0}
                for name in buf.index.robots.names
            },
        )
        assert lost == 0
        seqs = buf.index.view("seq")
        robots = buf.index.view("robot")
        for code in range(len(buf.index.robots.names)):
            s = seqs[robots == code]
            assert len(s) == len(np.unique(s))
        # Payload survived, not just the index: the state encodes the seq.
        rows = np.arange(buf.first_row, buf.visible, dtype=np.int64)
        got = buf.storage.gather(rows, ["observation.state"], count=False)["observation.state"]
        np.testing.assert_array_equal(got[:, 0], seqs.astype(np.float32))
    assert obs_value(0, 1) == 1.0
