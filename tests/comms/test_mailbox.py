"""An upload stream's mailbox: batches taken in arrival order, one round at a time, results
delivered in round order; a full or closed mailbox refuses; a failing round is delivered."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from comms.cloud.services.mailbox import Mailbox


@pytest.fixture
def pool() -> Any:
    ex = ThreadPoolExecutor(max_workers=4)
    yield ex
    ex.shutdown(wait=True)


def test_batches_from_many_threads_are_taken_once_in_order_one_round_at_a_time(
    pool: ThreadPoolExecutor,
) -> None:
    taken: list[int] = []
    delivered: list[list[int]] = []
    running = [0]
    overlap = [0]
    lock = threading.Lock()

    def take(batches: list[Any]) -> list[int]:
        with lock:
            running[0] += 1
            overlap[0] = max(overlap[0], running[0])
        time.sleep(0.001)  # rounds take time, so puts pile up behind them
        taken.extend(batches)
        with lock:
            running[0] -= 1
        return list(batches)

    done = threading.Event()

    def deliver(result: list[int]) -> None:
        delivered.append(result)
        if sum(len(r) for r in delivered) == 2000:
            done.set()

    box = Mailbox(take, deliver, pool, max_pending=10_000)
    counter = iter(range(2000))
    order_lock = threading.Lock()

    def producer() -> None:
        for _ in range(500):
            with order_lock:  # the arrival order is the order of puts
                assert box.put(next(counter))

    threads = [threading.Thread(target=producer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert done.wait(10)
    assert taken == list(range(2000))
    assert [x for r in delivered for x in r] == list(range(2000))
    assert overlap[0] == 1  # never two rounds at once
    assert len(delivered) < 2000  # batches that waited were taken together


def test_a_full_mailbox_refuses_and_a_closed_one_drops_what_waits(
    pool: ThreadPoolExecutor,
) -> None:
    gate = threading.Event()
    entered = threading.Event()
    results: list[list[int]] = []

    def take(batches: list[Any]) -> list[int]:
        entered.set()
        gate.wait(10)
        return list(batches)

    box = Mailbox(take, results.append, pool, max_pending=3)
    assert box.put(0)  # taken by the first round, which waits at the gate
    assert entered.wait(5)
    assert box.put(1) and box.put(2) and box.put(3)
    assert box.full and not box.put(4)
    box.close()
    assert not box.full and not box.put(5)
    gate.set()
    deadline = time.monotonic() + 5
    while not results and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    assert results == [[0]]  # 1..3 were dropped by close, never taken


def test_a_round_that_raises_is_delivered_and_closes_the_mailbox(
    pool: ThreadPoolExecutor,
) -> None:
    got: list[Any] = []
    arrived = threading.Event()

    def take(batches: list[Any]) -> Any:
        raise ValueError(f"bad {batches}")

    def deliver(result: Any) -> None:
        got.append(result)
        arrived.set()

    box = Mailbox(take, deliver, pool, max_pending=8)
    assert box.put("x")
    assert arrived.wait(5)
    assert isinstance(got[0], ValueError) and "bad ['x']" in str(got[0])
    assert not box.put("y")
