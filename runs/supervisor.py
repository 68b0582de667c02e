"""Restart a crashed child with exponential backoff; give up on a crash loop.

A run's learner is a child process. :meth:`ProcessSupervisor.poll`, called periodically by the
run driver, notices an unexpected exit (any exit while the run wants it alive: a SIGKILL, an
exception, an OOM kill), waits (:class:`RestartPolicy`: doubling from ``initial_s`` to
``max_s``, reset after ``stable_after_s`` of healthy running) and starts it again; the child
resumes from its own durable state (the learner from its last checkpoint). More than
``max_restarts`` crashes within ``window_s`` seconds is a crash loop (:class:`CrashWindow`):
the supervisor stops trying and reports why (the run is then marked ``crashed`` with that
reason). The run driver applies the same policy to its edge agents. A child that exits with one
of its ``final_exit_codes`` (the learner's "refused": restarting cannot help) is left dead at
once and :meth:`ProcessSupervisor.poll` raises :class:`ChildRefused`.

A child can also hang: alive, but making no progress (deadlocked, stuck in I/O, stopped). The
owner reports progress with :meth:`ProcessSupervisor.note_progress` (any value that changes
while the child works, e.g. the learner's batch count); with ``hang_after_s`` set, a child whose
value has not changed for that long since its last progress (or its start) is SIGKILLed with a
``<name>.hung`` event and handled like any other crash: restart with backoff, crash loop.
From each start until the child's first progress, ``start_hang_s`` applies instead when set: a
restarted learner imports torch and loads its checkpoint before it takes a batch, which on a
loaded machine can outlast the limit of a working one.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections import deque
from collections.abc import Callable, Collection, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path

from foundation.retry import Backoff

log = logging.getLogger(__name__)


class CrashLoop(RuntimeError):
    """The child crashed ``max_restarts`` times within ``window_s``; ``str`` says how."""


class ChildRefused(RuntimeError):
    """The child exited with one of its final exit codes (``code``); it is not restarted."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class RestartPolicy:
    """When to restart a crashed child and when to give up.

    Restart delays (seconds) start at ``initial_s`` and double up to ``max_s``
    (:class:`foundation.retry.Backoff` without jitter), from ``initial_s`` again once the child
    ran ``stable_after_s``; the crash-loop window: more than ``max_restarts`` crashes within
    ``window_s`` seconds and the child is left dead.
    """

    initial_s: float = 0.5
    max_s: float = 10.0
    stable_after_s: float = 60.0
    max_restarts: int = 5
    window_s: float = 300.0

    def backoff(self) -> Backoff:
        """A fresh delay sequence of this policy."""
        return Backoff(self.initial_s, self.max_s, jitter=False)


class CrashWindow:
    """The crashes of one child within its policy's window (monotonic seconds)."""

    def __init__(self, policy: RestartPolicy) -> None:
        self.policy = policy
        self._times: deque[float] = deque()

    def record(self, now: float) -> int:
        """Note a crash at ``now``; returns how many fall within the window, this one included."""
        self._times.append(now)
        while self._times and now - self._times[0] > self.policy.window_s:
            self._times.popleft()
        return len(self._times)

    @property
    def looping(self) -> bool:
        """More than ``max_restarts`` crashes within the window: a crash loop."""
        return len(self._times) > self.policy.max_restarts


class ProcessSupervisor:
    """Keeps one child process alive.

    Args:
        name: for logs and events (``learner``).
        argv: the child's command line.
        log_path: the child's stdout and stderr are appended here.
        policy: when to restart and when to give up (default :class:`RestartPolicy`).
        on_event: ``(kind, data)`` for every start, exit and restart (the run's audit log).
        env: environment of the child (default: ours).
        hang_after_s: seconds without progress after which a running child counts as hung
            (None: never); the owner may change it at any time (e.g. longer during warm-up).
        start_hang_s: the limit from each start until the child's first progress (None: the
            same as ``hang_after_s``); the owner may change it at any time.
        final_exit_codes: exit codes that mean restarting cannot help (the child refused).
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        policy: RestartPolicy | None = None,
        on_event: Callable[[str, dict[str, object]], None] | None = None,
        env: dict[str, str] | None = None,
        hang_after_s: float | None = None,
        final_exit_codes: Collection[int] = (),
        start_hang_s: float | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.policy = policy or RestartPolicy()
        self.on_event = on_event or (lambda _k, _d: None)
        self.env = env
        self.hang_after_s = hang_after_s
        self.start_hang_s = start_hang_s
        self._started_up = False  # progress seen since the last start
        self._baseline = True  # the first marker after a start is where it starts from
        self.final_exit_codes = frozenset(final_exit_codes)
        self.hangs = 0
        self._killed_hung = False
        self._progress: Hashable = None
        self._progress_at = 0.0
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self._crashes = CrashWindow(self.policy)
        self._backoff = self.policy.backoff()
        self._restart_at: float | None = None
        self._started_at = 0.0
        self._wanted = False

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def start(self) -> None:
        self._wanted = True
        self._spawn()

    def _spawn(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, env=self.env
            )
        self._started_at = self._progress_at = time.monotonic()
        self._started_up = False
        self._baseline = True
        self._restart_at = None
        self.on_event(f"{self.name}.started", {"pid": self.proc.pid, "restarts": self.restarts})

    def note_progress(self, marker: Hashable) -> None:
        """Report the child's progress; a ``marker`` different from the last one resets the
        hang clock (equal markers mean no progress)."""
        if self._baseline and self.proc is not None:
            self._baseline = False
            self._progress = marker  # what the last child left counts for nothing
        elif marker != self._progress:
            self._progress = marker
            self._progress_at = time.monotonic()
            self._started_up = self.proc is not None

    def _kill_if_hung(self) -> None:
        assert self.proc is not None
        silent = time.monotonic() - self._progress_at
        limit = self.hang_after_s
        if not self._started_up and self.start_hang_s is not None and limit is not None:
            limit = max(limit, self.start_hang_s)
        if limit is None or silent <= limit:
            return
        self.hangs += 1
        self._killed_hung = True
        log.error("%s made no progress for %.0fs; killing it", self.name, silent)
        self.on_event(
            f"{self.name}.hung",
            {"pid": self.proc.pid, "silent_s": round(silent, 1), "limit_s": limit},
        )
        self.proc.kill()  # SIGKILL also ends a SIGSTOPped process
        self.proc.wait()

    def poll(self) -> str:
        """Check the child; restart it when due. Returns ``running``, ``waiting`` or ``exited``.

        Raises:
            CrashLoop: too many crashes in the window; the child is left dead.
            ChildRefused: it exited with one of its ``final_exit_codes``; it is left dead.
        """
        if self.proc is None:
            return "exited"
        code = self.proc.poll()
        if code is None and self._wanted:
            self._kill_if_hung()
            code = self.proc.poll()
        if code is None:
            if time.monotonic() - self._started_at > self.policy.stable_after_s:
                self._backoff.reset()
            return "running"
        if not self._wanted:
            return "exited"
        now = time.monotonic()
        if self._restart_at is None:
            how = f"signal {-code}" if code < 0 else f"exit code {code}"
            crashes = self._crashes.record(now)
            self.on_event(
                f"{self.name}.died", {"how": how, "pid": self.proc.pid, "hung": self._killed_hung}
            )
            self._killed_hung = False
            if code in self.final_exit_codes:
                self._wanted = False
                raise ChildRefused(f"{self.name} refused ({how}); see {self.log_path}", code)
            if self._crashes.looping:
                self._wanted = False
                raise CrashLoop(
                    f"{self.name} crashed {crashes} times in "
                    f"{self.policy.window_s:.0f}s (last: {how}); see {self.log_path}"
                )
            delay = self._backoff.next()
            self._restart_at = now + delay
            log.warning("%s died (%s); restarting in %.1fs", self.name, how, delay)
            return "waiting"
        if now < self._restart_at:
            return "waiting"
        self.restarts += 1
        self._spawn()
        self.on_event(f"{self.name}.restarted", {"restarts": self.restarts})
        return "running"

    def signal(self, sig: int) -> bool:
        """Send ``sig`` to the running child; False when none runs."""
        pid = self.pid
        if pid is None:
            return False
        os.kill(pid, sig)
        return True

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """Ask the child to finish (SIGTERM), wait, SIGKILL when late; returns its exit code."""
        self._wanted = False
        return None if self.proc is None else terminate(self.proc, timeout_s)


def terminate(
    proc: subprocess.Popen[bytes], timeout_s: float, kill: Callable[[], object] | None = None
) -> int | None:
    """Ask ``proc`` to finish (SIGTERM) and wait up to ``timeout_s`` seconds; when it is late,
    ``kill`` it (default: SIGKILL and wait; a caller may end its whole process tree).

    Returns:
        Its exit code (negative: the signal that ended it); None when ``kill`` left it running.
    """
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            if kill is None:
                proc.kill()
                proc.wait()
            else:
                kill()
    return proc.returncode
