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


# The sampling side alone, on counts a learner in another process tells it (robofleet's
# learner process: robots are never blocked, the learner waits for data).


def _updates_allowed(updates: int, spi: float, rows: int, batch: int) -> bool:
    """Whether one more update of ``batch`` rows may run after ``updates`` updates."""
    return RateLimiter.sampling_side(spi).allows_sample(
        batch, inserts=rows, samples=updates * batch
    )


def test_sampling_side_half_an_update_per_env_step_at_batch_128() -> None:
    # 64 samples per insert at batch 128: 1000 robot rows allow exactly 500 updates.
    assert _updates_allowed(499, 64.0, 1000, 128)
    assert not _updates_allowed(500, 64.0, 1000, 128)
    assert not _updates_allowed(0, 64.0, 0, 128)  # no robot data yet: the learner waits
    assert _updates_allowed(0, 64.0, 2, 128)


def test_sampling_side_does_not_charge_a_warm_start() -> None:
    # learner.step - bc_updates is negative while the warm start's updates are replayed.
    assert _updates_allowed(-300, 64.0, 2, 128)


def test_sampling_side_allowance_grows_with_the_data_whatever_the_fleet() -> None:
    # 8 robots or 1: the same rows allow the same updates (the schedule is per env step).
    allowed = [max(u for u in range(5000) if _updates_allowed(u, 64.0, rows, 128)) + 1
               for rows in (200, 400, 800)]  # fmt: skip
    assert allowed == [100, 200, 400]


@pytest.mark.parametrize(
    ("spi", "batch", "what"),
    [(0.0, 128, "samples_per_insert"), (-1.0, 128, "samples_per_insert"), (64.0, 0, "n ")],
)
def test_sampling_side_refuses_bad_rates_by_name(spi: float, batch: int, what: str) -> None:
    with pytest.raises(ValueError, match=what):
        _updates_allowed(0, spi, 100, batch)


def test_sampling_side_never_blocks_inserts_and_counts_nothing() -> None:
    rl = RateLimiter.sampling_side(64.0)
    rl.await_insert(10_000, timeout=0)  # far beyond any error buffer: never refused
    assert rl.can_insert(10_000)
    assert rl.allows_sample(128, inserts=2, samples=0)
    assert (rl.inserts, rl.samples) == (10_000, 0)  # told counts are not its own
