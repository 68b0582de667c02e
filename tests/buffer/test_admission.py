"""The appends' combiner (``buffer.admission``) and the writer staging through it."""

from __future__ import annotations

import threading
import time

import pytest

from buffer import BufferSettings, RateLimiter, ReplayBuffer
from buffer.admission import Combiner, Ticket
from tests.buffer.helpers import episodes, small_schema


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

    combiner: Combiner[_Job] = Combiner(stage)
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

    combiner: Combiner[_Job] = Combiner(stage)
    jobs = [_Job(0, n) for n in range(6)]
    for j in jobs:
        combiner.submit(j)
    assert [type(j.error) for j in jobs] == [type(None)] * 3 + [ValueError] + [type(None)] * 2
    assert "bad batch 3" in str(jobs[3].error)


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
