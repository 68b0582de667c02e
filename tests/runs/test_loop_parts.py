"""The run loop's small parts: the cadence of its periodic jobs, the full-disk notice (once
per interval, as a log line and an event), and the stop conditions."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from foundation.runspec import StopSpec
from runs.cadence import Every
from runs.disk_notice import DiskFullNotice
from runs.stop_conditions import reached


def test_a_job_is_due_once_per_interval() -> None:
    first = Every(2.0)  # never ran: due at the first turn
    assert first.due(100.0) and not first.due(101.9) and first.due(102.0)
    later = Every(1.0, last=100.0)  # ran at 100: due one interval on
    assert not later.due(100.5) and later.due(101.0) and not later.due(101.5)


def test_a_full_disk_is_said_once_per_interval(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    notice = DiskFullNotice("run-1", lambda kind, **data: events.append((kind, data)), 60.0)
    now = [1000.0]
    monkeypatch.setattr("runs.disk_notice.time.monotonic", lambda: now[0])
    full = OSError(28, "No space left on device")
    with caplog.at_level(logging.WARNING, "runs.disk_notice"):
        notice.note(full)
        now[0] += 59.0
        notice.note(full)
        now[0] += 1.0
        notice.note(full)
    assert [k for k, _ in events] == ["run.disk_full", "run.disk_full"]
    assert "No space left on device" in events[0][1]["reason"]
    assert caplog.text.count("run run-1: disk full") == 2


def test_stop_conditions_name_what_was_reached() -> None:
    assert reached(StopSpec(), 1e6, {"env_steps": 10**9, "success_mean": 1.0}) is None
    minutes = StopSpec(minutes=2)
    assert reached(minutes, 119.0, {}) is None
    assert reached(minutes, 120.0, {}) == "reached 2.0 minutes"
    steps = StopSpec(env_steps=500, target_success=0.8)
    assert reached(steps, 0.0, {"env_steps": 499, "success_mean": 0.5}) is None
    assert reached(steps, 0.0, {"env_steps": 500}) == "reached 500 env steps"
    assert reached(steps, 0.0, {"success_mean": 0.8}) == "reached success 0.8"
