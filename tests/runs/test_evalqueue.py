"""EvaluationQueue against a real Ray actor that evaluates slowly."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from runs.evalqueue import EvalSnapshot, EvaluationQueue


class SlowEvaluator:
    """Success = the version (read from the bytes) / 100, after ``delay_s``."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.seen: list[int] = []

    def evaluate(self, weights: bytes) -> dict[str, float]:
        time.sleep(self.delay_s)
        version = int(weights.decode())
        self.seen.append(version)
        return {"reach-v3": version / 100}

    def order(self) -> list[int]:
        return self.seen


@pytest.fixture(scope="module")
def ray_local() -> Iterator[None]:
    import ray

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _snap(version: int, wall_s: float) -> EvalSnapshot:
    return EvalSnapshot(
        version, str(version).encode(), wall_s, wall_s / 3600, version * 10, version
    )


def test_slow_evaluator_keeps_every_snapshot_and_its_stamp(ray_local: None) -> None:
    import ray

    actor = ray.remote(num_cpus=0)(SlowEvaluator).remote(0.3)
    q = EvaluationQueue(actor.evaluate.remote, backlog=10)
    for v in range(1, 6):  # five snapshots, far faster than the evaluator
        assert q.add(_snap(v, wall_s=10.0 * v)) is None
    assert len(q) == 5
    assert q.poll() is None  # the first one is still being evaluated
    rows = []
    while len(q):
        got = q.poll(wait=True)
        assert got is not None
        rows.append(got)
    assert [s.version for s, _ in rows] == [1, 2, 3, 4, 5]  # oldest first, none lost
    assert [s.wall_s for s, _ in rows] == [10.0, 20.0, 30.0, 40.0, 50.0]  # stamped when taken
    assert [r["reach-v3"] for _, r in rows] == [0.01, 0.02, 0.03, 0.04, 0.05]
    assert ray.get(actor.order.remote()) == [1, 2, 3, 4, 5]
    assert q.poll() is None and q.dropped == 0


def test_backlog_drops_the_oldest_waiting_snapshot_not_the_one_in_flight(ray_local: None) -> None:
    import ray

    actor = ray.remote(num_cpus=0)(SlowEvaluator).remote(0.3)
    q = EvaluationQueue(actor.evaluate.remote, backlog=2)
    dropped = [q.add(_snap(v, wall_s=v)) for v in range(1, 6)]
    # 1 is in flight; 2..5 wait with room for 2: 2 then 3 are dropped.
    assert [d.version if d else None for d in dropped] == [None, None, None, 2, 3]
    assert q.dropped == 2 and len(q) == 3
    done = []
    while len(q):
        got = q.poll(wait=True)
        assert got is not None
        done.append(got[0].version)
    assert done == [1, 4, 5]
    assert ray.get(actor.order.remote()) == [1, 4, 5]


def test_a_failed_evaluation_is_raised_not_swallowed(ray_local: None) -> None:
    import ray

    actor = ray.remote(num_cpus=0)(SlowEvaluator).remote(0.0)
    q = EvaluationQueue(actor.evaluate.remote, backlog=2)
    q.add(EvalSnapshot(1, b"not a number", 0.0, 0.0, 0, 0))
    with pytest.raises(ray.exceptions.RayTaskError, match="invalid literal"):
        q.poll(wait=True)


def test_backlog_must_be_positive() -> None:
    with pytest.raises(ValueError, match="backlog must be >= 1"):
        EvaluationQueue(lambda b: None, backlog=0)
