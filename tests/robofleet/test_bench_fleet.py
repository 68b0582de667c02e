"""``robofleet bench fleet``: its options, the figures it derives, and a small run."""

from __future__ import annotations

import argparse
import json
import math
import os

import pytest

from robofleet.bench import fleet as F
from robofleet.bench.fleet_procs import TimedSpool, recording, stamp


def test_robot_counts_and_kinds_are_parsed_and_bad_ones_refused() -> None:
    args = F.parse_args(["--robots", "16,64,256", "--kinds", "camera"])
    assert args.robots == [16, 64, 256] and args.kinds == ["camera"]
    assert F.parse_args([]).robots == [16, 64, 256]
    for bad in ("0", "4,-1", "x", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            F.parse_robots(bad)
    with pytest.raises(argparse.ArgumentTypeError):
        F.parse_kinds("state,video")
    with pytest.raises(SystemExit):
        F.parse_args(["--drivers", "0"])


def test_latency_percentiles_count_a_never_acked_batch_as_infinitely_late() -> None:
    lat = [i / 1000 for i in range(1, 101)]  # 1 .. 100 ms
    p50, p99 = F.latency_ms(lat, unacked=0)
    assert (p50, p99) == pytest.approx((51.0, 100.0))
    _, p99 = F.latency_ms(lat, unacked=2)  # 2 of 102 batches never acked: beyond the top 1%
    assert math.isinf(p99)
    assert all(math.isnan(x) for x in F.latency_ms([], 0))


def test_cloud_cpu_per_robot_and_the_largest_count_under_the_limit() -> None:
    cores, per_robot = F.cloud_per_robot(cpu_s=3.0, window_s=10.0, robots=64)
    assert cores == pytest.approx(0.3) and per_robot == pytest.approx(300 / 64)

    def case(kind: str, robots: int, p99: float, unacked: int = 0) -> F.Case:
        return F.Case(kind, robots, 2, 100, unacked, 5.0, p99, 0, 0, 0.0, 0.1, 1.0, 1.0)

    cases = [
        case("state", 16, 20.0),
        case("state", 64, 99.0),
        case("state", 256, 400.0),
        case("camera", 16, 50.0, unacked=1),  # an unacked batch disqualifies
    ]
    assert F.largest_under(cases, "state") == 64
    assert F.largest_under(cases, "camera") is None
    out = F.result([case("camera", 16, math.inf)], ["camera"])
    assert out["cases"][0]["p99_ms"] is None  # JSON has no infinity
    json.dumps(out)


def test_proc_cpu_reads_this_process() -> None:
    before = F.proc_cpu_s(os.getpid())
    sum(i * i for i in range(300_000))
    assert F.proc_cpu_s(os.getpid()) >= before > 0


def test_replayed_batches_are_each_robots_own_steps_in_order() -> None:
    tpl = recording("camera", batch_steps=10, run_id="run-1")[0]
    assert tpl.num_rows == 10 and 900_000 < tpl.nbytes < 1_100_000  # ~100 KB a step
    b = stamp(tpl, robot_id=7, first_seq=30)
    assert b.column("seq").to_pylist() == list(range(30, 40))
    assert set(b.column("robot_id").to_pylist()) == {"7"}
    spool = TimedSpool()
    spool.put(39, b"x" * 10, at=0.0)
    spool.put(49, b"y" * 10, at=0.0)
    assert [e.last_seq for e in spool.entries_after(39, 8)] == [49]
    spool.ack(39)
    assert list(spool.latencies) == [39] and spool.bytes == 10


@pytest.mark.slow
def test_a_small_fleet_is_served_and_every_batch_acked() -> None:
    args = F.parse_args(["--robots", "2", "--seconds", "3", "--warmup", "2", "--drain", "10"])
    case = F.run_case("state", 2, args)
    assert 10 <= case.acked <= 12 and case.unacked == 0  # 2 robots x 2 batches/s x 3 s
    assert case.p99_ms < 10_000 and case.cloud_cores > 0
    # the buffer's share of the ack latency, by phase: the fdatasync always takes some
    assert set(case.append_phases_ms) == {"staging", "writing", "durable", "visible"}
    assert case.append_phases_ms["durable"] > 0
