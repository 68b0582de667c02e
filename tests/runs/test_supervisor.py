"""ProcessSupervisor with real child processes: restart with backoff, crash loop, a child's
refusal (never restarted), clean stop; ``terminate`` of a child late to exit."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runs.supervisor import (
    ChildRefused,
    CrashLoop,
    CrashWindow,
    ProcessSupervisor,
    RestartPolicy,
    terminate,
)

FAST = RestartPolicy(initial_s=0.1, max_s=0.4, stable_after_s=60, max_restarts=3, window_s=60)


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


def test_a_final_exit_code_is_never_restarted(tmp_path: Path) -> None:
    seen: list[str] = []
    sup = ProcessSupervisor(
        "refuser",
        [sys.executable, "-c", "raise SystemExit(4)"],
        tmp_path / "log",
        FAST,
        on_event=lambda kind, _data: seen.append(kind),
        final_exit_codes=[4],
    )
    sup.start()
    with pytest.raises(ChildRefused, match=r"refuser refused \(exit code 4\)") as err:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            sup.poll()
            time.sleep(0.05)
    assert err.value.code == 4
    assert sup.restarts == 0 and seen == ["refuser.started", "refuser.died"]
    time.sleep(FAST.max_s + 0.1)  # past any restart delay: it stays dead
    assert sup.poll() == "exited" and sup.restarts == 0


# A child that appends a byte to a file every 50 ms: the file's size is its progress.
TICKER = (
    "import sys, time\nwhile True:\n    open(sys.argv[1], 'ab').write(b'.')\n    time.sleep(0.05)"
)


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def test_a_stopped_child_is_killed_as_hung_and_restarted(tmp_path: Path) -> None:
    ticks = tmp_path / "ticks"
    seen: list[tuple[str, dict[str, object]]] = []
    sup = ProcessSupervisor(
        "ticker",
        [sys.executable, "-c", TICKER, str(ticks)],
        tmp_path / "log",
        FAST,
        on_event=lambda kind, data: seen.append((kind, data)),
        hang_after_s=1.5,
    )
    sup.start()
    first = sup.pid
    assert first is not None
    deadline = time.monotonic() + 4.0  # progressing: never called hung, however long it runs
    while time.monotonic() < deadline:
        sup.note_progress(_size(ticks))
        assert sup.poll() == "running"
        time.sleep(0.1)
    assert sup.hangs == 0 and sup.pid == first

    assert sup.signal(signal.SIGSTOP)  # alive, but making no progress
    t0 = time.monotonic()
    while sup.poll() == "running":
        sup.note_progress(_size(ticks))
        assert time.monotonic() - t0 < 10, "the hang was never detected"
        time.sleep(0.1)
    assert 1.5 <= time.monotonic() - t0
    assert sup.hangs == 1
    kinds = [k for k, _ in seen]
    assert kinds[-2:] == ["ticker.hung", "ticker.died"]
    hung, died = seen[-2][1], seen[-1][1]
    assert hung["pid"] == first and float(hung["silent_s"]) >= 1.5  # type: ignore[arg-type]
    assert died == {"how": "signal 9", "pid": first, "hung": True}

    _poll_until(sup, "running")  # restarted like any crash, and it ticks again
    assert sup.restarts == 1 and sup.pid not in (None, first)
    before = _size(ticks)
    deadline = time.monotonic() + 10
    while _size(ticks) <= before + 5:
        assert time.monotonic() < deadline, "the restarted child made no progress"
        time.sleep(0.1)
    assert sup.stop(timeout_s=10) == -signal.SIGTERM


def test_hang_detection_off_by_default(tmp_path: Path) -> None:
    sup = ProcessSupervisor(
        "sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "log", FAST
    )
    sup.start()
    time.sleep(0.5)
    assert sup.poll() == "running" and sup.hangs == 0  # never reported progress: not judged
    sup.hang_after_s = 0.2  # the owner turns it on later (e.g. after warm-up)
    time.sleep(0.3)
    assert sup.poll() == "waiting" and sup.hangs == 1
    sup.stop(timeout_s=10)


def test_restart_policy_doubles_its_delays_to_the_cap_without_jitter() -> None:
    backoff = RestartPolicy(initial_s=0.5, max_s=10.0).backoff()
    assert [backoff.next() for _ in range(7)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    backoff.reset()
    assert backoff.next() == 0.5
    # The edge agents' delay: by the crashes already in the window, as run.py asks for it.
    assert [backoff.delay(n) for n in (0, 1, 4, 5)] == [0.5, 1.0, 8.0, 10.0]


def test_crash_window_counts_crashes_within_the_window_only() -> None:
    window = CrashWindow(RestartPolicy(max_restarts=2, window_s=10.0))
    assert [window.record(t) for t in (0.0, 1.0, 2.0)] == [1, 2, 3]
    assert window.looping  # 3 crashes > 2 restarts within 10 s
    assert window.record(11.5) == 2  # the crashes at 0 and 1 s left the window
    assert not window.looping


def _ignoring_sigterm() -> subprocess.Popen[bytes]:
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
    code += " print('ready', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    return proc


def test_terminate_kills_a_child_that_ignores_sigterm_its_callers_way() -> None:
    plain = _ignoring_sigterm()
    assert terminate(plain, 0.5) == -signal.SIGKILL  # SIGKILL after the wait
    own = _ignoring_sigterm()
    killed: list[int] = []

    def kill() -> None:  # e.g. the soak's cloud: its whole process tree
        killed.append(own.pid)
        own.kill()
        own.wait()

    assert terminate(own, 0.5, kill) == -signal.SIGKILL and killed == [own.pid]
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    assert terminate(done, 0.5, kill) == 0 and killed == [own.pid]  # nothing to end


def test_a_restarted_child_gets_its_start_up_limit_until_its_first_progress(
    tmp_path: Path,
) -> None:
    ticks = tmp_path / "ticks"
    sup = ProcessSupervisor(
        "slow-starter",
        # start-up (imports, a checkpoint) takes 1.5 s before the first tick
        [sys.executable, "-c", f"import time; time.sleep(1.5)\n{TICKER}", str(ticks)],
        tmp_path / "log",
        FAST,
        hang_after_s=0.6,
        start_hang_s=5.0,
    )
    sup.start()
    for restart in range(2):  # the first start and a restart after a kill
        deadline = time.monotonic() + 4.0
        while time.monotonic() < deadline:
            sup.note_progress(_size(ticks))
            assert sup.poll() == "running", f"start {restart}: killed during its start-up"
            time.sleep(0.05)
        assert sup.hangs == 0 and _size(ticks) > 0
        assert sup.signal(signal.SIGKILL) and sup.proc is not None
        sup.proc.wait()
        ticks.unlink()
        _poll_until(sup, "running")
    # once it made progress, the working limit applies again
    deadline = time.monotonic() + 3.0
    while _size(ticks) == 0:
        sup.note_progress(_size(ticks))
        sup.poll()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    sup.note_progress(_size(ticks))
    assert sup.signal(signal.SIGSTOP)
    t0 = time.monotonic()
    while sup.poll() == "running":
        sup.note_progress(_size(ticks))
        assert time.monotonic() - t0 < 4.0, "a working child's hang waited for the start-up limit"
        time.sleep(0.05)
    assert sup.hangs == 1
    sup.stop(timeout_s=10)
