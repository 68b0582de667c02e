"""foundation.retry.Backoff, the one backoff of comms' clients and the supervisor."""

from __future__ import annotations

import random
import threading

import pytest

from foundation.retry import Backoff


def test_equal_jitter_keeps_half_of_each_doubling_bound() -> None:
    backoff = Backoff(0.2, 1.0, rng=random.Random(0))
    bounds = [0.2, 0.4, 0.8, 1.0, 1.0]
    delays = [backoff.next() for _ in bounds]
    for d, bound in zip(delays, bounds, strict=True):
        assert bound / 2 <= d <= bound
    assert len(set(delays)) == len(delays)  # drawn, not fixed
    assert backoff.attempts == 5
    backoff.reset()
    assert backoff.attempts == 0 and 0.1 <= backoff.next() <= 0.2


def test_without_jitter_the_delays_are_exact_and_capped() -> None:
    backoff = Backoff(0.5, 3.0, jitter=False)
    assert [backoff.next() for _ in range(4)] == [0.5, 1.0, 2.0, 3.0]
    assert backoff.delay(1000) == 3.0  # no overflow far out
    assert backoff.attempts == 4  # delay() does not advance


def test_sleep_returns_at_once_when_stopped() -> None:
    stop = threading.Event()
    stop.set()
    assert Backoff(60.0, 60.0).sleep(stop)  # set already: no 30-60 s wait
    assert not Backoff(0.01, 0.01).sleep(threading.Event())


@pytest.mark.parametrize(("initial_s", "max_s"), [(0.0, 1.0), (-1.0, 1.0), (2.0, 1.0)])
def test_refuses_bounds_that_cannot_back_off(initial_s: float, max_s: float) -> None:
    with pytest.raises(ValueError, match="initial_s"):
        Backoff(initial_s, max_s)
