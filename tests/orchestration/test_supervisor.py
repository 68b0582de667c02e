"""ProcessSupervisor with real child processes: restart with backoff, crash loop, clean stop."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

from robofleet.orchestration.supervisor import Backoff, CrashLoop, ProcessSupervisor

FAST = Backoff(initial_s=0.1, max_s=0.4, stable_after_s=60, max_restarts=3, window_s=60)


def _poll_until(sup: ProcessSupervisor, want: str, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if sup.poll() == want:
            return
        time.sleep(0.05)
    raise AssertionError(f"supervisor never reached {want}")


def test_sigkilled_child_is_restarted_and_stops_cleanly(tmp_path: Path) -> None:
    seen: list[str] = []
    sup = ProcessSupervisor(
        "sleeper",
        [sys.executable, "-c", "import time; time.sleep(60)"],
        tmp_path / "log",
        FAST,
        on_event=lambda kind, _data: seen.append(kind),
    )
    sup.start()
    first = sup.pid
    assert first is not None and sup.poll() == "running"
    assert sup.signal(signal.SIGKILL)
    _poll_until(sup, "waiting")
    _poll_until(sup, "running")
    assert sup.restarts == 1 and sup.pid not in (None, first)
    assert seen == ["sleeper.started", "sleeper.died", "sleeper.started", "sleeper.restarted"]
    assert sup.stop(timeout_s=10) == -signal.SIGTERM
    assert sup.poll() == "exited"  # a requested stop is never restarted


def test_crash_loop_gives_up_with_the_reason(tmp_path: Path) -> None:
    sup = ProcessSupervisor(
        "crasher", [sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "log", FAST
    )
    sup.start()
    with pytest.raises(CrashLoop, match=r"crasher crashed 4 times .*exit code 3"):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            sup.poll()
            time.sleep(0.05)
    assert sup.restarts == FAST.max_restarts
