"""The open tail reads its large columns (camera frames) back from its WAL files
(``buffer.table.tail_reads``): the right frames from every stripe, before and after a seal, when
the encoder's offsets are missing, and after a failed write made the WAL cut back."""

from __future__ import annotations

import errno
import threading
import time
from typing import Any

import numpy as np
import pytest

import buffer.table.commit as commit_mod
from buffer import DiskFullError, ReplayBuffer
from buffer.errors import CorruptDataError
from buffer.files.encoding import ipc_message
from buffer.files.wal import WriteAheadLog, keep_only, scan_wal
from buffer.table.tail_reads import WalTailReader
from tests.buffer.helpers import episodes, open_buffer, small_schema

IMG = (48, 48, 3)  # 6,912 B a frame: over a page, so a writer's tail does not copy it
FRAME = "observation.images.front"


def _check_frames(buf: ReplayBuffer, rows: np.ndarray) -> None:
    """Every pixel of each row's frame, and of its next frame, is what its step wrote."""
    b = buf.read_transitions(rows)
    seqs = buf.index.view("seq")[rows]
    want = (seqs % 251).astype(np.uint8)[:, None, None, None]
    assert (b[FRAME] == want).all(), "a frame came back other than written"
    done = b["terminated"] | b["truncated"]
    nxt = np.where(done, 255, (seqs + 1) % 251).astype(np.uint8)[:, None, None, None]
    assert (b["next." + FRAME] == nxt).all(), "a next frame came back other than written"
    np.testing.assert_array_equal(b["observation.state"][:, 0] % 100_000, seqs)


def _fill(buf: ReplayBuffer, robots: int, episodes_each: int) -> None:
    """Robots append 10-step batches from threads of their own (they land in every stripe)."""

    def robot(r: int) -> None:
        recs = episodes(r, [10] * episodes_each, image=IMG)
        for i in range(0, len(recs), 10):
            buf.append(recs[i : i + 10])

    threads = [threading.Thread(target=robot, args=(r,)) for r in range(robots)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_the_open_tail_holds_only_small_columns_and_reads_frames_from_its_wal(tmp_path) -> None:
    schema = small_schema(image=IMG)
    with open_buffer(tmp_path / "b", schema, segment_target_bytes=1 << 26, wal_stripes=4) as buf:
        _fill(buf, robots=4, episodes_each=6)
        st = buf.storage
        (tail,) = st.chunks  # everything is still in the open tail
        assert not tail.sealed and tail.n == 240
        assert FRAME not in tail.arrays and "observation.state" in tail.arrays
        assert tail.resident_bytes == tail.capacity * st.small_row_bytes
        assert st.hot_bytes() <= 2 * tail.capacity * st.small_row_bytes  # tail + spare
        _check_frames(buf, np.arange(240, dtype=np.int64))
        b = buf.sample(64, rng=np.random.default_rng(0))
        assert (b[FRAME] == b[FRAME][:, :1, :1, :1]).all()


def test_a_sealed_tail_is_cold_until_sampling_promotes_it(tmp_path) -> None:
    schema = small_schema(image=IMG)
    seg = 40 * schema.fixed_row_bytes
    with open_buffer(
        tmp_path / "b", schema, segment_target_bytes=seg, prefetch_interval_s=0.01
    ) as buf:
        _fill(buf, robots=2, episodes_each=6)
        buf.flush()
        st = buf.storage
        sealed = [c for c in st.chunks if c.sealed]
        assert len(sealed) >= 2
        assert all(not c.hot and "observation.state" in c.arrays for c in sealed)
        _check_frames(buf, np.arange(buf.num_steps, dtype=np.int64))  # read from segments
        deadline = time.monotonic() + 30
        while not all(c.hot for c in sealed):
            assert time.monotonic() < deadline, "sampled segments were never promoted"
            buf.sample(64)
            time.sleep(0.01)
        assert st.promotions >= len(sealed)
        _check_frames(buf, np.arange(buf.num_steps, dtype=np.int64))  # now from RAM


def test_frames_read_right_when_the_encoder_gives_no_offsets(tmp_path, monkeypatch) -> None:
    real = commit_mod.ipc_message

    def no_offsets(batch: Any, names: Any) -> Any:
        return real(batch, names)[0], None  # as if the encoder had copied a column

    monkeypatch.setattr(commit_mod, "ipc_message", no_offsets)
    with open_buffer(tmp_path / "b", small_schema(image=IMG), segment_target_bytes=1 << 26) as buf:
        _fill(buf, robots=3, episodes_each=3)
        assert not buf.storage.chunks[-1].sealed
        _check_frames(buf, np.arange(buf.num_steps, dtype=np.int64))


def test_frames_read_right_after_a_failed_write_cut_the_wal_back(tmp_path, monkeypatch) -> None:
    real = WriteAheadLog.write_record
    calls = [0]

    def failing(self: WriteAheadLog, first_row: int, payload: Any) -> tuple[int, int]:
        calls[0] += 1
        if calls[0] == 4:  # after some rows: this append is refused, the WAL cut back
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        return real(self, first_row, payload)

    monkeypatch.setattr(WriteAheadLog, "write_record", failing)
    recs = episodes(1, [10] * 8, image=IMG)
    with open_buffer(tmp_path / "b", small_schema(image=IMG), segment_target_bytes=1 << 26) as buf:
        i = 0
        refused = 0
        while i < len(recs):
            try:
                buf.append(recs[i : i + 10])
                i += 10
            except DiskFullError:
                refused += 1
        assert refused == 1 and buf.num_steps == len(recs)
        assert buf.writer.recoveries == 1
        _check_frames(buf, np.arange(buf.num_steps, dtype=np.int64))
    with open_buffer(tmp_path / "b", small_schema(image=IMG)) as again:
        _check_frames(again, np.arange(again.num_steps, dtype=np.int64))


@pytest.mark.parametrize("robots", [1, 3])
def test_reopened_buffer_reads_the_same_frames(tmp_path, robots: int) -> None:
    schema = small_schema(image=IMG)
    with open_buffer(tmp_path / "b", schema, segment_target_bytes=1 << 26) as buf:
        _fill(buf, robots=robots, episodes_each=4)
        n = buf.num_steps
    with open_buffer(tmp_path / "b", schema) as again:
        assert again.num_steps == n
        _check_frames(again, np.arange(n, dtype=np.int64))


def test_samples_taken_while_robots_append_read_the_right_frames(tmp_path) -> None:
    """Samplers read the open tail while robots append, tails rotate and seal and the
    prefetch thread promotes: every frame read is the one its row's step wrote."""
    schema = small_schema(image=IMG)
    seg = 60 * schema.fixed_row_bytes  # a seal every 60 rows: several rotations under reads
    errors: list[BaseException] = []
    stop = threading.Event()
    checked = [0]
    with open_buffer(
        tmp_path / "b", schema, segment_target_bytes=seg, prefetch_interval_s=0.01
    ) as buf:

        def sampler(seed: int) -> None:
            rng = np.random.default_rng(seed)
            try:
                while not stop.is_set():
                    n = buf.num_steps
                    if n < 2:
                        continue
                    rows = np.unique(rng.integers(0, n - 1, size=32)).astype(np.int64)
                    _check_frames(buf, rows)
                    checked[0] += len(rows)
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        readers = [threading.Thread(target=sampler, args=(s,)) for s in range(2)]
        for t in readers:
            t.start()
        try:
            _fill(buf, robots=4, episodes_each=8)
        finally:
            stop.set()
            for t in readers:
                t.join(30)
        assert not errors, errors
        assert checked[0] > 0
        assert sum(c.sealed for c in buf.storage.chunks) >= 3
        _check_frames(buf, np.arange(buf.num_steps, dtype=np.int64))


def test_a_reader_scanned_after_a_rewrite_finds_the_moved_records(tmp_path) -> None:
    """A recovery may rewrite a stripe without a dropped record that sat before kept ones
    (``wal.keep_only``): the kept records move, and a reader scanned from the file finds
    them; a reader opened before still reads the old file's inode, unchanged."""
    schema = small_schema(image=IMG)
    wal = WriteAheadLog(tmp_path, 0, 0.0)
    reader = WalTailReader([wal.path], 0, [FRAME])
    for first in (20, 0, 10):  # written out of row order, as concurrent appends may
        recs = episodes(0, [10], seq0=first, image=IMG)
        batch = schema.validate(schema.batch_from_records(recs))
        pieces, offsets = ipc_message(batch, [FRAME])
        assert offsets is not None
        _, start = wal.write_record(first, pieces)
        reader.add(first, 0, 10, [start + o for o in offsets])
    wal.sync_all()
    recs_in_file = scan_wal(wal.path).records
    keep_only(wal.path, recs_in_file, {0, 10})  # row 20's record goes: the file is rewritten
    assert [r.first_row for r in scan_wal(wal.path).records] == [0, 10]
    scanned = WalTailReader.scan([wal.path], 0, [FRAME], schema.arrow_schema, end=20)
    rows = np.arange(20, dtype=np.int64)
    for r in (scanned, reader):
        out = np.empty((20, *IMG), np.uint8)
        r.read_rows(FRAME, rows, out)
        assert (out == (rows % 251).astype(np.uint8)[:, None, None, None]).all()
    with pytest.raises(CorruptDataError, match="no record"):
        scanned.read_rows(FRAME, np.array([25]), np.empty((1, *IMG), np.uint8))
    wal.close()


@pytest.mark.parametrize("robots", [1, 2])
def test_next_frames_read_right_where_an_episode_spans_records(tmp_path, robots: int) -> None:
    """A frame and the next one are read in one call where they lie side by side in a record
    (``buffer.files.row_reads``); a step whose successor starts the next record (one robot's
    3-step appends) or is another robot's row (two robots taking turns) is read on its own."""
    schema = small_schema(image=IMG)
    seg = 16 * schema.fixed_row_bytes
    recs = [episodes(r, [10] * 4, image=IMG) for r in range(robots)]
    with open_buffer(
        tmp_path / "b", schema, segment_target_bytes=seg, prefetch=False, wal_stripes=2
    ) as buf:
        for i in range(0, 40, 3):
            for r in range(robots):
                buf.append(recs[r][i : i + 3])
        n = buf.num_steps
        assert n == 40 * robots
        st = buf.storage
        assert any(c.sealed for c in st.chunks) and not st.chunks[-1].sealed
        _check_frames(buf, np.arange(n, dtype=np.int64))  # cold segments and the open tail
        rows = np.random.default_rng(3).integers(0, n, size=200)
        _check_frames(buf, np.sort(rows))
