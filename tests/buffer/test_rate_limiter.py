"""Samples-per-insert rate limiter (Reverb's rule) and uplink backpressure."""

from __future__ import annotations

import threading
import time

import pytest

from buffer import BackpressureError, BufferClosedError, RateLimiter, RateLimiterTimeout
from tests.buffer.helpers import episodes, open_buffer


def test_rule_min_size_and_ratio() -> None:
    rl = RateLimiter(
        samples_per_insert=2.0, min_size_to_sample=10, error_buffer=20, max_insert=5, max_sample=10
    )
    assert not rl.can_sample(1)  # below min size (counted in transitions)
    rl.await_insert(10, timeout=0)
    assert rl.can_sample(10)
    # diff = 10*2 - samples; min_diff = 20 - 20 = 0
    rl.await_sample(20, timeout=0)
    with pytest.raises(RateLimiterTimeout):
        rl.await_sample(1, timeout=0.01)
    # max_diff = 40: inserting 5 (diff 10) ok, ... up to diff 40
    for _ in range(4):
        rl.await_insert(5, timeout=0)
    with pytest.raises(RateLimiterTimeout):
        rl.await_insert(5, timeout=0.01)


def test_deadlock_prone_parameters_rejected() -> None:
    with pytest.raises(ValueError, match="deadlock"):
        RateLimiter(1.0, 10, error_buffer=5, max_insert=64, max_sample=256)


def test_threads_never_deadlock_and_ratio_holds() -> None:
    rl = RateLimiter(samples_per_insert=4.0, min_size_to_sample=64, max_insert=16, max_sample=32)
    stop = threading.Event()

    def insert() -> None:
        while not stop.is_set():
            try:
                rl.await_insert(16, timeout=0.5)
            except (RateLimiterTimeout, BufferClosedError):
                return

    def sample() -> None:
        while not stop.is_set():
            try:
                rl.await_sample(32, timeout=0.5)
            except (RateLimiterTimeout, BufferClosedError):
                return

    threads = [threading.Thread(target=insert) for _ in range(2)]
    threads += [threading.Thread(target=sample) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    stop.set()
    rl.close()
    for t in threads:
        t.join(timeout=5)
        assert not t.is_alive()
    assert rl.inserts > 1000 and rl.samples > 1000  # both sides kept moving
    ratio = rl.samples / rl.inserts
    assert abs(ratio - 4.0) * rl.inserts <= rl.error_buffer + 4 * 64 + 32


def test_close_wakes_waiters() -> None:
    rl = RateLimiter(1.0, 10)
    err: list[BaseException] = []

    def wait() -> None:
        try:
            rl.await_sample(1)
        except BaseException as e:  # noqa: BLE001
            err.append(e)

    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.05)
    rl.close()
    t.join(timeout=2)
    assert isinstance(err[0], BufferClosedError)


def test_buffer_backpressure_and_learner_side(tmp_path) -> None:
    rl = RateLimiter(
        samples_per_insert=1.0, min_size_to_sample=8, error_buffer=8, max_insert=8, max_sample=8
    )
    recs = episodes(0, [8] * 6)
    with open_buffer(tmp_path / "b", rate_limiter=None) as _:
        pass
    from buffer import BufferSettings, ReplayBuffer
    from tests.buffer.helpers import small_schema

    buf = ReplayBuffer.open(tmp_path / "c", small_schema(), BufferSettings(), rate_limiter=rl)
    try:
        with pytest.raises(RateLimiterTimeout):
            buf.sample(4, timeout=0.01)  # below min size
        buf.append(recs[:8], timeout=0)
        buf.append(recs[8:16], timeout=0)  # diff 16 == max_diff: still allowed
        assert not buf.can_accept(8)
        with pytest.raises(BackpressureError) as err:
            buf.append(recs[16:24], timeout=0.01)
        assert err.value.retry_after_s > 0
        assert buf.num_steps == 16  # the refused batch was not stored
        # Duplicates never count against the limiter.
        assert buf.append(recs[:8], timeout=0).duplicates == 8
        buf.sample(8, timeout=1)
        assert buf.can_accept(8)
        assert buf.append(recs[16:24], timeout=0).stored == 8
    finally:
        buf.close()
