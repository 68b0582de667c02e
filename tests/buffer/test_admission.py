"""The appends' combiner (``buffer.table.combiner``) and the writer staging through it."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from buffer import (
    AppendResult,
    BufferSettings,
    RateLimiter,
    ReplayBuffer,
    StepValidationError,
)
from buffer.table.combiner import Combiner, Ticket, one_at_a_time
from tests.buffer.helpers import Appends, HeldCombiner, episodes, open_buffer, small_schema


class _Job(Ticket):
    __slots__ = ("thread", "n")

    def __init__(self, thread: int, n: int) -> None:
        super().__init__()
        self.thread, self.n = thread, n


def test_every_ticket_is_staged_once_one_at_a_time_in_each_callers_order() -> None:
    staged: list[tuple[int, int]] = []
    active = [0]
    overlaps = [0]

    def stage(job: _Job) -> None:
        active[0] += 1
        if active[0] > 1:
            overlaps[0] += 1
        time.sleep(0) if job.n % 7 else time.sleep(0.0005)  # let others queue up
        staged.append((job.thread, job.n))
        active[0] -= 1

    combiner: Combiner[_Job] = Combiner(one_at_a_time(stage))
    threads = [
        threading.Thread(target=lambda i=i: [combiner.submit(_Job(i, n)) for n in range(300)])
        for i in range(6)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert overlaps[0] == 0
    assert sorted(staged) == [(i, n) for i in range(6) for n in range(300)]
    for i in range(6):
        assert [n for th, n in staged if th == i] == list(range(300))


def test_a_stage_that_raises_fails_only_its_ticket() -> None:
    def stage(job: _Job) -> None:
        if job.n == 3:
            raise ValueError("bad batch 3")

    combiner: Combiner[_Job] = Combiner(one_at_a_time(stage))
    jobs = [_Job(0, n) for n in range(6)]
    for j in jobs:
        combiner.submit(j)
    assert [type(j.error) for j in jobs] == [type(None)] * 3 + [ValueError] + [type(None)] * 2
    assert "bad batch 3" in str(jobs[3].error)


def test_a_group_stage_parks_tickets_and_a_failure_fails_only_those_not_staged() -> None:
    def stage_group(group: list[_Job], staged: Any) -> None:
        for job in group:
            if job.n == 1:
                job.parked = True  # finished later by someone else, who wakes it
            elif job.n == 2:
                staged(job)
            else:
                raise RuntimeError("the stage broke")

    release = threading.Event()

    def held(group: list[_Job], staged: Any) -> None:
        assert release.wait(10)
        stage_group(group, staged)

    combiner: Combiner[_Job] = Combiner(held)
    holder = _Job(9, 2)
    # Queued in this order behind the holder's group: ``lead`` combines the next group and
    # its own ticket is staged last, after ``broken`` raised.
    lead, parked, plain, broken = _Job(0, 2), _Job(1, 1), _Job(2, 2), _Job(3, 3)
    threads = {}
    for job in (holder, lead, parked, plain, broken):
        threads[job.thread] = t = threading.Thread(target=combiner.submit, args=(job,))
        queued = len(combiner._queue)
        t.start()
        while len(combiner._queue) == queued and not (job is holder and combiner._busy):
            time.sleep(0.001)
    combiner._stage_group = stage_group  # type: ignore[method-assign]
    release.set()
    for job in (holder, lead, plain, broken):
        threads[job.thread].join(timeout=10)
        assert not threads[job.thread].is_alive()
    assert holder.error is None and plain.error is None
    assert isinstance(broken.error, RuntimeError) and lead.error is broken.error
    time.sleep(0.05)
    assert threads[parked.thread].is_alive()  # parked: the combiner did not wake it
    assert parked.error is None
    parked.wake()
    threads[parked.thread].join(timeout=10)
    assert not threads[parked.thread].is_alive()


def test_an_append_waiting_for_the_rate_limiter_holds_up_no_other_append(tmp_path) -> None:
    rl = RateLimiter(
        samples_per_insert=1.0, min_size_to_sample=8, error_buffer=8, max_insert=8, max_sample=8
    )
    recs = episodes(0, [8] * 4)
    other = episodes(1, [8])
    buf = ReplayBuffer.open(tmp_path / "b", small_schema(), BufferSettings(), rate_limiter=rl)
    try:
        buf.append(recs[:8], timeout=0)
        buf.append(recs[8:16], timeout=0)
        assert not buf.can_accept(8)
        done: list[object] = []
        waiter = threading.Thread(target=lambda: done.append(buf.append(recs[16:24])))
        waiter.start()  # no timeout: waits for room, outside the combiner
        time.sleep(0.2)
        assert not done
        # Meanwhile a retry of stored steps is acknowledged and a refusal is immediate.
        assert buf.append(recs[:8], timeout=0).duplicates == 8
        with pytest.raises(Exception, match="ahead of sampling"):
            buf.append(other, timeout=0)
        buf.sample(8, timeout=1)  # room for 8 more
        waiter.join(timeout=5)
        assert not waiter.is_alive()
        assert done[0].stored == 8  # type: ignore[attr-defined]
        assert buf.num_steps == 24
    finally:
        buf.close()


def _grouped(buf: ReplayBuffer, batches: list[Any], timeout: float | None = None) -> list[Any]:
    """Append ``batches`` (one thread each) so that all but the first wait for the combiner
    together: the first one's staging is held until the others are queued behind it.
    Returns each append's result, or what it raised."""
    appends = Appends(buf)
    with HeldCombiner(buf) as held:
        threads = [appends.start("0", batches[0], timeout)]
        held.wait_held()
        threads += [appends.start(str(i), b, timeout) for i, b in enumerate(batches) if i]
        held.wait_queued(len(batches) - 1)
        held.release()
        for t in threads:
            t.join(timeout=30)
        assert not any(t.is_alive() for t in threads)
    return [appends.out[str(i)] for i in range(len(batches))]


def _limited(tmp_path: Path) -> tuple[ReplayBuffer, RateLimiter]:
    """A buffer whose rate limiter has no room left (24 steps in, none sampled)."""
    rl = RateLimiter(
        samples_per_insert=1.0, min_size_to_sample=8, error_buffer=16, max_insert=16, max_sample=16
    )
    buf = ReplayBuffer.open(tmp_path / "b", small_schema(), BufferSettings(), rate_limiter=rl)
    buf.append(episodes(9, [24]), timeout=0)
    assert not buf.can_accept(1)
    return buf, rl


def _waits_for_room(rl: RateLimiter) -> threading.Event:
    """An event set once an append starts waiting for room (an insert with no timeout)."""
    entered = threading.Event()
    real = rl.await_insert

    def spy(n: int, timeout: float | None = None) -> None:
        if timeout is None:
            entered.set()
        real(n, timeout)

    rl.await_insert = spy  # type: ignore[method-assign]
    return entered


def test_small_appends_waiting_together_are_stored_as_one_and_each_gets_its_result(
    tmp_path: Path,
) -> None:
    recs = {r: episodes(r, [6, 6]) for r in range(8)}
    path = tmp_path / "b"
    buf = open_buffer(path)
    try:
        fsyncs = buf.stats()["wal_fsyncs"]
        results = _grouped(buf, [recs[r][:6] for r in range(8)])
        assert buf.stats()["merged_appends"] == 7  # all but the first, held alone
        assert buf.stats()["wal_fsyncs"] - fsyncs <= 2  # the first's, the merged one's
        assert buf.writer.ack_phases.count == 2  # a merged append is timed once
        for r, res in enumerate(results):
            assert isinstance(res, AppendResult), res
            assert res.acked == {f"robot-{r}": 5}
            assert (res.stored, res.duplicates) == (6, 0)
            assert res.rows[1] - res.rows[0] == 6
        spans = sorted(res.rows for res in results)
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
        # Resends merged with new steps: duplicates counted per append, ranges per append.
        again = _grouped(buf, [recs[0][6:], recs[1][:6], recs[2][:3] + recs[2][6:9]])
        assert [(a.stored, a.duplicates) for a in again] == [(6, 0), (0, 6), (3, 3)]
        assert again[1].acked == {"robot-1": 5}
        assert again[2].acked == {"robot-2": 8}
        assert again[2].rows[1] - again[2].rows[0] == 3
        assert buf.stats()["merged_appends"] == 9
    finally:
        buf.close()
    with open_buffer(path) as reopened:
        for r in range(8):
            want = 12 if r == 0 else 9 if r == 2 else 6
            assert list(reopened.stored_seqs(f"robot-{r}")) == list(range(want))
        _payloads_are_their_steps(reopened)


def test_a_bad_batch_among_merged_appends_fails_alone(tmp_path: Path) -> None:
    recs = {r: episodes(r, [6]) for r in range(5)}
    bad = [dict(s) for s in recs[3]]
    bad[2]["reward"] = float("nan")
    late = episodes(4, [6], seq0=100)  # stored first below; then seq 0.. is out of order
    buf = open_buffer(tmp_path / "b")
    try:
        buf.append(late)
        results = _grouped(buf, [recs[0], recs[1], recs[2], bad, recs[4]])
        assert isinstance(results[3], StepValidationError) and "reward" in str(results[3])
        assert isinstance(results[4], StepValidationError) and "out of order" in str(results[4])
        for r in range(3):
            assert isinstance(results[r], AppendResult)
            assert results[r].acked == {f"robot-{r}": 5}
            assert list(buf.stored_seqs(f"robot-{r}")) == list(range(6))
        assert buf.stats()["merged_appends"] == 0  # the group failed, staged one at a time
        assert len(buf.stored_seqs("robot-3")) == 0
        assert list(buf.stored_seqs("robot-4")) == list(range(100, 106))
    finally:
        buf.close()


def test_merged_appends_without_room_in_the_rate_limiter_are_staged_alone(
    tmp_path: Path,
) -> None:
    rl = RateLimiter(
        samples_per_insert=1.0, min_size_to_sample=8, error_buffer=16, max_insert=16, max_sample=16
    )
    buf = ReplayBuffer.open(tmp_path / "b", small_schema(), BufferSettings(), rate_limiter=rl)
    try:
        buf.append(episodes(9, [16]), timeout=0)
        assert buf.can_accept(8) and not buf.can_accept(9)
        # 2 held alone (room left: 6), then 5 + 5 merged do not fit: staged alone, one is
        # stored and the other refused at once (timeout 0).
        results = _grouped(buf, [episodes(0, [2]), episodes(1, [5]), episodes(2, [5])], timeout=0)
        assert isinstance(results[0], AppendResult) and results[0].stored == 2
        kinds = sorted(type(r).__name__ for r in results[1:])
        assert kinds == ["AppendResult", "BackpressureError"], results
        assert buf.stats()["merged_appends"] == 0
        assert buf.num_steps == 16 + 2 + 5
    finally:
        buf.close()


def _payloads_are_their_steps(buf: ReplayBuffer) -> None:
    """Every sampled row's payload is its own step's (the state encodes robot and seq)."""
    b = buf.sample(64, rng=np.random.default_rng(0))
    robots = np.array([int(r.split("-")[1]) for r in b["robot_id"]])
    obs = b["observation.state"][:, 0]
    seqs = obs.astype(np.int64) - robots * 100_000
    assert ((seqs >= 0) & (seqs < 100)).all()
    np.testing.assert_array_equal(b["action"][:, 0], obs)
    np.testing.assert_array_equal(b["reward"], (seqs % 13).astype(np.float32))


def test_an_append_staged_again_after_waiting_for_room_waits_for_a_busy_combiner(
    tmp_path: Path,
) -> None:
    """An append that combined its own group, found no room and waited for it, is staged
    again behind another combiner's group (before, its own ticket was left marked woken, and
    it returned unstaged when it queued behind a busy combiner: an AssertionError)."""
    buf, rl = _limited(tmp_path)
    appends = Appends(buf)
    out = appends.out
    try:
        entered = _waits_for_room(rl)
        waiting = appends.start("waiting", episodes(0, [4]))  # combines alone, waits for room
        assert entered.wait(10)
        with HeldCombiner(buf) as held:
            other = appends.start("other", episodes(1, [2]))
            held.wait_held()
            buf.sample(16, timeout=5)  # room: the waiting append is staged again, queued
            held.wait_queued(1)
            time.sleep(0.1)
            assert "waiting" not in out  # it waits for the busy combiner
            held.release()
            for t in (waiting, other):
                t.join(timeout=10)
                assert not t.is_alive()
        assert isinstance(out["waiting"], AppendResult), out["waiting"]
        assert out["waiting"].stored == 4
        assert isinstance(out["other"], AppendResult) and out["other"].stored == 2
        assert buf.num_steps == 30
    finally:
        buf.close()


def test_room_admitted_ahead_goes_back_when_the_append_is_refused_before_staging(
    tmp_path: Path,
) -> None:
    """An append that waited for room, got it, then was refused when staged again (here a
    later batch of its robot was stored first: its seqs are out of order) gives the room back:
    the rate limiter counts only the stored inserts."""
    buf, rl = _limited(tmp_path)
    appends = Appends(buf)
    try:
        r0 = episodes(0, [8])
        entered = _waits_for_room(rl)
        first = appends.start("first", r0[:4])  # no room: waits for it
        assert entered.wait(10)
        with HeldCombiner(buf) as held:
            other = appends.start("other", episodes(5, [2]))
            held.wait_held()
            buf.sample(16, timeout=5)  # room: the first append, admitted ahead, queues
            held.wait_queued(1)
            later = appends.start("later", r0[4:], 0)  # its robot's later seqs, behind it
            held.wait_queued(2)
            held.release()
            for t in (first, other, later):
                t.join(timeout=10)
                assert not t.is_alive()
        out = appends.out
        stored = sum(r.stored for r in out.values() if isinstance(r, AppendResult))
        assert buf.num_steps == 24 + stored
        assert rl.inserts == buf.num_steps  # before the fix: 4 more (the refused append's)
        # It combined the next group and staged its own ticket last, after its robot's later
        # batch (one robot appending from two threads has no order between them).
        assert isinstance(out["first"], StepValidationError), out["first"]
        assert "out of order" in str(out["first"])
        assert out["later"].stored == 4 and out["other"].stored == 2
    finally:
        buf.close()
