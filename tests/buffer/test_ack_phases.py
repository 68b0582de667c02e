"""Where an append's acknowledgement latency goes (``buffer.table.ack_phases``, ``stats()``)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from buffer.table.ack_phases import PHASES, AckPhases
from tests.buffer.helpers import episodes, open_buffer


def test_phases_split_the_interval_between_the_readings() -> None:
    p = AckPhases()
    p.add(10.0, 10.5, 10.75, 11.75, 12.0)
    p.add(20.0, 20.5, 20.75, 20.0, 21.0)  # no fdatasync reading: nothing counted durable
    assert p.count == 2
    ms = p.mean_ms()
    assert ms == pytest.approx(
        {"staging": 500.0, "writing": 250.0, "durable": 500.0, "visible": 250.0}
    )
    assert AckPhases().mean_ms() == dict.fromkeys(PHASES, 0.0)


def test_the_phases_of_appends_add_up_to_their_latency(tmp_path: Path) -> None:
    with open_buffer(tmp_path / "b") as buf:
        for r in range(4):
            buf.append(episodes(r, [20]))
        buf.append(episodes(0, [20]))  # a pure retry writes nothing: not timed
        assert buf.writer.ack_phases.count == 4
        stats = buf.stats()
        phases = [stats[f"ack_{p}_ms"] for p in PHASES]
        assert all(v >= 0 for v in phases)
        mean_ms = float(np.mean(buf.writer.ack_latencies[:4])) * 1e3
        assert 0.5 * mean_ms <= sum(phases) <= mean_ms + 1e-3


def test_a_slow_fdatasync_shows_in_the_durable_phase(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_buffer(tmp_path / "b") as buf:
        buf.append(episodes(0, [5]))  # first-call costs (imports, plans) out of the way
        before = buf.writer.ack_phases.mean_ms()
        real = os.fdatasync

        def slow(fd: int) -> None:
            time.sleep(0.05)
            real(fd)

        monkeypatch.setattr(os, "fdatasync", slow)
        for r in range(1, 4):
            buf.append(episodes(r, [5]))
        monkeypatch.undo()
        stats = buf.stats()
        assert buf.writer.ack_phases.count == 4
        # The mean of the 3 appends whose fdatasync took 50 ms, per phase.
        slow_ms = {p: (4 * stats[f"ack_{p}_ms"] - before[p]) / 3 for p in PHASES}
        assert slow_ms["durable"] >= 45.0
        assert slow_ms["durable"] > slow_ms["staging"] + slow_ms["writing"] + slow_ms["visible"]
