"""A full disk under the buffer: appends are refused by name (``DiskFullError``, retryable),
nothing acknowledged is lost, and the buffer takes appends again by itself once space is
back (no reopen), on a real tmpfs and with ENOSPC injected into the WAL writes."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

from buffer import DiskFullError, ReplayBuffer
from buffer.files.wal import WriteAheadLog, scan_wal
from buffer.table.index import RowIndex
from tests.buffer.helpers import Appends, episodes, open_buffer, small_schema
from tests.fakes.disk import Disk


def _seqs(buf: ReplayBuffer, robot: int) -> list[int]:
    return [int(s) for s in buf.stored_seqs(f"robot-{robot}")]


def _payload_matches(buf: ReplayBuffer) -> None:
    """Every sampled row's payload is the step its (robot, seq) names, and its next
    observation its episode's next step (links across the refused appends hold)."""
    b = buf.sample(256, rng=np.random.default_rng(0))
    robots = np.array([int(r.split("-")[1]) for r in b["robot_id"]])
    obs = b["observation.state"][:, 0]
    seqs = obs.astype(np.int64) - robots * 100_000
    np.testing.assert_array_equal(b["action"][:, 0], obs)
    np.testing.assert_array_equal(b["reward"], (seqs % 13).astype(np.float32))
    done = b["terminated"] | b["truncated"]
    np.testing.assert_array_equal(
        b["next.observation.state"][:, 0], np.where(done, -obs - 1, obs + 1)
    )


def test_full_disk_is_a_named_refusal_and_the_buffer_recovers_by_itself(
    full_disk: Disk,
) -> None:
    recs = episodes(1, [10] * 30)
    path = full_disk.path / "buf"
    buf = open_buffer(path)
    try:
        for i in range(0, 50, 10):
            buf.append(recs[i : i + 10])
        full_disk.fill()
        # What still fits in the last pages is stored; then every append is refused.
        i, refusals = 50, 0
        while refusals < 3:
            assert i < len(recs), "the full disk never refused an append"
            try:
                assert buf.append(recs[i : i + 10]).acked == {"robot-1": i + 9}
                i += 10
                refusals = 0
            except DiskFullError as exc:
                refusals += 1
                assert "buffer disk full" in str(exc) and "retry" in str(exc), str(exc)
        assert _seqs(buf, 1) == list(range(i))  # every acknowledged step, nothing more
        full_disk.free()
        while i < len(recs):  # the refused batch again, then the rest: no reopen
            assert buf.append(recs[i : i + 10]).acked == {"robot-1": i + 9}
            i += 10
        assert _seqs(buf, 1) == list(range(len(recs)))
        _payload_matches(buf)
    finally:
        buf.close()
    with open_buffer(path) as again:
        assert _seqs(again, 1) == list(range(len(recs)))
        assert again.num_steps == len(recs)
        _payload_matches(again)


def test_concurrent_writers_through_a_full_disk_lose_no_acknowledged_step(
    full_disk: Disk,
) -> None:
    robots, batch = 4, 7
    recs = {r: episodes(r, [10] * 40) for r in range(robots)}
    acked: dict[int, int] = {r: -1 for r in range(robots)}
    refused = [0]
    errors: list[BaseException] = []
    lock = threading.Lock()
    path = full_disk.path / "buf"
    buf = open_buffer(path, wal_stripes=2)

    def robot(r: int) -> None:
        rows, i = recs[r], 0
        try:
            while i < len(rows):
                try:
                    got = buf.append(rows[i : i + batch]).acked[f"robot-{r}"]
                except DiskFullError:
                    with lock:
                        refused[0] += 1
                    time.sleep(0.005)  # a robot's retry: the same steps again
                    continue
                assert got == rows[min(i + batch, len(rows)) - 1]["seq"]
                with lock:
                    acked[r] = got
                i += batch
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=robot, args=(r,)) for r in range(robots)]
    try:
        for t in threads:
            t.start()
        _wait(lambda: min(acked.values()) >= 40, "the robots never got going")
        full_disk.fill()
        _wait(lambda: refused[0] >= 40, "the full disk refused nothing")
        before = dict(acked)
        for r in range(robots):  # what was acknowledged is stored, and readable
            assert _seqs(buf, r)[: before[r] + 1] == list(range(before[r] + 1))
        full_disk.free()
        for t in threads:
            t.join(60)
        assert not errors, errors
        for r in range(robots):
            assert _seqs(buf, r) == list(range(len(recs[r])))
    finally:
        full_disk.free()
        for t in threads:
            t.join(60)
        buf.close()
    with open_buffer(path) as again:
        for r in range(robots):
            assert _seqs(again, r) == list(range(len(recs[r])))
        _payload_matches(again)


def _wait(cond: Any, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def test_wal_reset_keeps_exactly_the_records_below_the_watermark(tmp_path: Any) -> None:
    # Records are written in the order appends reach the disk, not in row order: the one of
    # rows [10, 15) (never acknowledged) can sit before the acknowledged one of rows [5, 10).
    def rec(first: int) -> bytes:
        return f"rows {first}..{first + 5}".encode()

    wal = WriteAheadLog(tmp_path, 0, 0.0)
    for first in (0, 10, 5):
        wal.sync(wal.write(first, rec(first)))
    wal.reset(10)
    assert [r.first_row for r in scan_wal(wal.path).records] == [0, 5]
    wal.sync(wal.write(10, b"new rows 10..15"))
    wal.reset(15)  # nothing to drop: the file is untouched
    assert [(r.first_row, r.payload) for r in scan_wal(wal.path).records] == [
        (0, rec(0)),
        (5, rec(5)),
        (10, b"new rows 10..15"),
    ]
    wal.close()


def test_index_truncate_is_as_if_the_rows_were_never_added() -> None:
    schema = small_schema()

    def batch(recs: list[dict[str, Any]]) -> Any:
        return schema.validate(schema.batch_from_records(recs))

    r1, r2 = episodes(1, [10, 10]), episodes(2, [6, 6])
    kept = [r1[:7], r2[:4]]  # both robots' episodes are open at the cut
    dropped = [r1[7:13], r2[4:9], episodes(3, [3])]  # closes, opens and a new robot
    again = [r1[7:15], r2[4:12]]

    def index(parts: list[list[dict[str, Any]]]) -> RowIndex:
        idx = RowIndex()
        for p in parts:
            b = batch(p)
            idx.add(b)
        return idx

    cut = index(kept + dropped)
    cut.truncate(sum(len(p) for p in kept))
    for p in again:
        b = batch(p)
        cut.add(b)
    fresh = index(kept + again)
    for name in ("seq", "next_row", "prev_row", "episode_index", "frame_index"):
        np.testing.assert_array_equal(cut.view(name), fresh.view(name), err_msg=name)
    robots = {name: code for name, code in cut.robots.codes.items()}
    for name, code in fresh.robots.codes.items():
        mine, theirs = cut.robot_seqs[robots[name]], fresh.robot_seqs[code]
        assert mine.seqs[: mine.n].tolist() == theirs.seqs[: theirs.n].tolist()
        assert cut.robot_last_row[robots[name]] == fresh.robot_last_row[code]
    assert cut.last_seq("robot-3") is None
    assert cut._open == fresh._open  # the episodes left open, with their latest row
    assert cut.publish(0, cut.end) == fresh.publish(0, fresh.end)
    np.testing.assert_array_equal(cut.view("eligible"), fresh.view("eligible"))


def test_close_after_a_failed_fdatasync_acknowledges_nothing_behind_it(
    tmp_path: Any, monkeypatch: Any
) -> None:
    """Append Y's fdatasync fails (EIO); append Z (later rows, another stripe) has written its
    record when the buffer is closed. A later fdatasync proves nothing about the pages the
    failed one lost, so close must not count Y's stripe as synced, and Z is refused."""
    import errno
    import zlib

    from buffer.table.commit import GroupCommit

    buf = open_buffer(tmp_path / "b", wal_stripes=2)
    assert buf.writer.wal is not None

    def stripe(r: int) -> int:
        return zlib.crc32(f"robot-{r}".encode()) % 2

    ry = 0
    rz = next(r for r in range(1, 50) if stripe(r) != stripe(ry))
    wal_y = buf.writer.wal.logs[stripe(ry)]
    real_commit, real_write = GroupCommit.commit, GroupCommit.write
    y_written, z_at_commit, z_go = threading.Event(), threading.Event(), threading.Event()

    def commit(self: GroupCommit, claim: Any, cols: Any, lsn: int) -> Any:
        if cols.robot.names[0] == f"robot-{rz}":
            z_at_commit.set()
            assert z_go.wait(10)
        else:
            assert z_at_commit.wait(10)

            def failing(_lsn: int) -> None:
                raise OSError(errno.EIO, "injected fdatasync EIO")

            wal_y.sync = failing  # type: ignore[method-assign]
        return real_commit(self, claim, cols, lsn)

    def write(self: GroupCommit, claim: Any) -> int:
        lsn = real_write(self, claim)
        if claim.cols.robot.names[0] == f"robot-{ry}":
            y_written.set()
        return lsn

    monkeypatch.setattr(GroupCommit, "commit", commit)
    monkeypatch.setattr(GroupCommit, "write", write)
    appends = Appends(buf)
    out = appends.out
    ty = appends.start("Y", episodes(ry, [4]))
    assert y_written.wait(10)
    tz = appends.start("Z", episodes(rz, [4]))
    ty.join(10)
    assert isinstance(out["Y"], OSError) and out["Y"].errno == errno.EIO
    closing = threading.Thread(target=buf.close)
    closing.start()
    closing.join(10)
    assert buf.state.visible == 0
    z_go.set()
    tz.join(10)
    assert not tz.is_alive() and not closing.is_alive()
    assert isinstance(out["Z"], OSError), out["Z"]  # before the fix: acknowledged


def test_a_pure_retry_waiting_across_a_recovery_is_refused_not_acknowledged(
    tmp_path: Any, monkeypatch: Any
) -> None:
    """A retry whose records are all in the index waits for them to be durable; if a
    recovery ran meanwhile (it drops rows above the durable watermark, never acknowledged,
    and later rows take their place) it is refused, not acknowledged on those later rows."""
    from buffer.table.watermark import Watermark

    recs = episodes(1, [8])
    buf = open_buffer(tmp_path / "b")
    try:
        buf.append(recs)
        real = Watermark.acknowledge

        def after_a_recovery(self: Watermark, claim: Any, cols: Any) -> Any:
            writer = self.writer
            with writer.state.lock:  # as ``recover`` leaves it, between staging and the wait
                writer.recovered_from = OSError(5, "injected EIO")
                writer.recoveries += 1
            return real(self, claim, cols)

        monkeypatch.setattr(Watermark, "acknowledge", after_a_recovery)
        with pytest.raises(OSError, match="may have been dropped .*retry it"):
            buf.append(recs)
        monkeypatch.setattr(Watermark, "acknowledge", real)
        assert buf.append(recs).duplicates == 8  # retried: its steps are durable here
    finally:
        buf.close()
