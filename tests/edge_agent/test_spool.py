"""The durable spool: seq ownership, acks, the full policy, and a SIGKILL mid-write."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pytest

from edge_agent.spool import Spool, SpoolError


def batch(first: int, n: int, payload: int = 64) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "seq": pa.array(range(first, first + n), pa.int64()),
            "blob": pa.array([b"x" * payload] * n, pa.binary()),
        }
    )


def put(sp: Spool, n: int, payload: int = 64):
    first = sp.reserve(n)
    return sp.write(batch(first, n, payload))


def test_seq_is_contiguous_and_survives_reopen(tmp_path):
    sp = Spool(tmp_path, 10**6)
    for n in (3, 5, 2):
        put(sp, n)
    assert [(e.first, e.last) for e in sp.pending()] == [(0, 2), (3, 7), (8, 9)]
    again = Spool(tmp_path, 10**6)
    assert again.next_seq == 10
    assert [(e.first, e.last) for e in again.pending()] == [(0, 2), (3, 7), (8, 9)]
    assert again.read(again.pending()[1]).column("seq").to_pylist() == list(range(3, 8))


def test_ack_deletes_durable_batches_and_is_remembered(tmp_path):
    sp = Spool(tmp_path, 10**6)
    for _ in range(4):
        put(sp, 5)
    sp.ack(9)
    assert [e.first for e in sp.pending()] == [10, 15]
    assert len(list((tmp_path / "batches").iterdir())) == 2
    again = Spool(tmp_path, 10**6)
    assert again.acked_seq == 9 and again.next_seq == 20
    # comms' Uploader reads the wire bytes of what is left after a seq
    wire = again.entries_after(12, limit=10)
    assert [w.last_seq for w in wire] == [14, 19]
    got = pa.ipc.open_stream(pa.py_buffer(wire[1].data)).read_all()
    assert got.column("seq").to_pylist() == list(range(15, 20))


def test_a_cloud_ahead_of_a_wiped_spool_moves_seq_forward(tmp_path):
    sp = Spool(tmp_path, 10**6)
    sp.ack(41)  # the cloud says it holds up to 41
    assert sp.next_seq == 42
    assert put(sp, 2).first == 42


def test_write_refuses_rows_that_are_not_the_reserved_range(tmp_path):
    sp = Spool(tmp_path, 10**6)
    sp.reserve(3)
    with pytest.raises(SpoolError, match="not the reserved"):
        sp.write(batch(5, 3))
    with pytest.raises(SpoolError, match="without a matching reserve"):
        sp.write(batch(0, 4))
    assert sp.pending() == []


def test_full_drop_oldest_counts_and_logs_the_gap(tmp_path):
    one = put(Spool(tmp_path / "probe", 10**6), 10, payload=100).nbytes
    sp = Spool(tmp_path / "s", max_bytes=int(one * 3.5), full_policy="drop_oldest")
    for _ in range(6):
        assert put(sp, 10, payload=100) is not None
    kept = [(e.first, e.last) for e in sp.pending()]
    assert kept == [(30, 39), (40, 49), (50, 59)]
    assert sp.nbytes <= sp.max_bytes
    assert sp.dropped_steps == 30 and sp.dropped_batches == 3
    log = sp.dropped_log()
    assert [(d["first_seq"], d["last_seq"]) for d in log] == [(0, 9), (10, 19), (20, 29)]
    assert all(d["seq_released"] is False for d in log)
    # seq kept counting through the gap, and the counters survive a restart
    again = Spool(tmp_path / "s", max_bytes=int(one * 3.5))
    assert again.next_seq == 60 and again.dropped_steps == 30


def test_full_drop_newest_gives_its_seqs_back(tmp_path):
    one = put(Spool(tmp_path / "probe", 10**6), 10, payload=100).nbytes
    sp = Spool(tmp_path / "s", max_bytes=int(one * 2.5), full_policy="drop_newest")
    results = [put(sp, 10, payload=100) for _ in range(4)]
    assert [r is not None for r in results] == [True, True, False, False]
    assert sp.next_seq == 20  # no gap: refused batches consumed no seq
    assert sp.dropped_steps == 20
    assert [d["seq_released"] for d in sp.dropped_log()] == [True, True]
    sp.ack(9)  # room again after the cloud took the first batch
    assert put(sp, 10, payload=100).first == 20


def test_bad_state_file_is_a_clear_error(tmp_path):
    (tmp_path / "batches").mkdir()
    (tmp_path / "state.json").write_text("{not json")
    with pytest.raises(SpoolError, match="unreadable spool state"):
        Spool(tmp_path, 10**6)
    with pytest.raises(ValueError, match="max_bytes"):
        Spool(tmp_path / "x", 0)


WRITER = textwrap.dedent(
    """
    import sys, pyarrow as pa
    from edge_agent.spool import Spool
    sp = Spool(sys.argv[1], 10**9)
    while True:
        n = 7
        first = sp.reserve(n)
        b = pa.RecordBatch.from_pydict({"seq": pa.array(range(first, first + n), pa.int64()),
                                        "blob": pa.array([b"y" * 2000] * n, pa.binary())})
        sp.write(b)
        print(first + n - 1, flush=True)
    """
)


def test_sigkill_mid_write_loses_nothing_acknowledged_and_never_reuses_seq(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    durable = []
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    while len(durable) < 40 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line:
            durable.append(int(line))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert len(durable) >= 40
    sp = Spool(tmp_path, 10**9)
    entries = sp.pending()
    seqs: list[int] = []
    for e in entries:
        seqs += sp.read(e).column("seq").to_pylist()
    # every batch reported durable is there, complete and in order, with no gap or repeat
    assert seqs == list(range(len(seqs)))
    assert seqs[-1] >= durable[-1]
    assert sp.next_seq == seqs[-1] + 1
    assert not list((tmp_path / "batches").glob("*.tmp"))
    assert json.loads((tmp_path / "state.json").read_text())["next_seq"] <= sp.next_seq
