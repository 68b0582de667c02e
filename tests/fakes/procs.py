"""Child processes of a test (a cloud, a site, a stand-in robot) and waiting on conditions.

Everything a test starts it stops by pid: :meth:`Child.kill` SIGKILLs the child and every
descendant it left (Ray workers, learners), never anything found by name.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from robofleet.bench.soak_probe import descendants

REPO = Path(__file__).resolve().parents[2]


def python_module(module: str, *args: str) -> list[str]:
    """``python -m module args`` with this interpreter."""
    return [sys.executable, "-m", module, *args]


def wait_until(
    cond: Callable[[], object],
    timeout_s: float,
    what: str | Callable[[], str] = "",
    *,
    every: Callable[[], object] | None = None,
    poll_s: float = 0.05,
) -> None:
    """Return once ``cond()`` is true; call ``every()`` between tries (e.g. a sync step).

    Raises:
        AssertionError: after ``timeout_s`` seconds, naming ``what`` (a text, or a function
            giving one, e.g. a process's log tail).
    """
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() >= deadline:
            why = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout_s}s" + (f": {why}" if why else ""))
        if every is not None:
            every()
        time.sleep(poll_s)


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class Child:
    """A child process in its own session, its output kept for the test.

    Args:
        argv: the command (``python_module(...)`` for a Python entry point).
        log: file for its output; None leaves stderr on the test's own.
        lines: read stdout line by line (:meth:`line`, :meth:`json`); else stdout and stderr
            both go to ``log`` (a chatty process such as ``robofleet cloud``).
        stdin: keep a pipe to its stdin (:meth:`ask`; :meth:`stop` closes it).
        env: its environment (default: this one, with this checkout first on PYTHONPATH).
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        log: Path | None = None,
        lines: bool = True,
        stdin: bool = False,
        env: dict[str, str] | None = None,
        cwd: Path = REPO,
    ) -> None:
        self.log = log
        self._log: IO[bytes] | None = log.open("wb") if log is not None else None
        if not lines and self._log is None:
            raise ValueError("a child whose output is not read needs a log")
        self.proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=env if env is not None else {**os.environ, "PYTHONPATH": str(REPO)},
            stdin=subprocess.PIPE if stdin else None,
            stdout=subprocess.PIPE if lines else self._log,
            stderr=self._log if lines else subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        if lines:
            threading.Thread(target=self._pump, daemon=True).start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)

    def output(self, chars: int = 4000) -> str:
        """The tail of its log (empty without one)."""
        if self.log is None:
            return ""
        return self.log.read_text(errors="replace")[-chars:]

    def line(self, timeout_s: float) -> str:
        """Its next stdout line, stripped.

        Raises:
            AssertionError: none within ``timeout_s`` (with the log's tail).
        """
        try:
            return self._lines.get(timeout=timeout_s).strip()
        except queue.Empty:
            raise AssertionError(f"no answer in {timeout_s} s; log: {self.output()}") from None

    def json(self, timeout_s: float) -> dict[str, Any]:
        """Its next stdout line as a JSON object."""
        return dict(json.loads(self.line(timeout_s)))

    def ask(self, command: str, timeout_s: float) -> dict[str, Any]:
        """Write ``command`` as one line to its stdin; its JSON answer."""
        assert self.proc.stdin is not None, "started without stdin=True"
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.json(timeout_s)

    def kill(self) -> list[int]:
        """SIGKILL it and every descendant; returns their pids once all are gone."""
        pids = descendants(self.proc.pid) + [self.proc.pid]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(30)
        wait_until(lambda: not any(alive(p) for p in pids), 30, "killed processes still there")
        return pids

    def stop(self, timeout_s: float) -> None:
        """Ask it to end (close its stdin, else SIGTERM), wait ``timeout_s``, else :meth:`kill`."""
        if self.proc.poll() is None:
            try:
                if self.proc.stdin is not None:
                    self.proc.stdin.close()
                else:
                    self.proc.send_signal(signal.SIGTERM)
                self.proc.wait(timeout_s)
            except (subprocess.TimeoutExpired, BrokenPipeError, OSError):
                self.kill()
        if self._log is not None:
            self._log.close()
