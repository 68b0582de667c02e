"""The robot's episode numbering, log and marks, kept in its spool directory across restarts.

``agent_state.json`` holds ``{"next_episode_index": int}`` (written atomically and durably,
:func:`foundation.durable.atomic_write_bytes`), so a restarted agent never reuses an
``episode_index`` the cloud may already hold. ``episodes.jsonl`` gets one line per recorded
episode: ``{"episode_index", "task", "steps", "label", "kind"}`` (``kind``: ``demonstration``
for an operator's demonstration, else ``episode``); a restarted agent reads it to count the
demonstrations it already recorded.

``marks.jsonl`` is the outbox of the operator's verdicts on episodes whose steps already left
(or will leave) the robot, and of each kept episode's outcome (``success`` / ``failure``): one
line ``{"run_id", "episode_index", "kind", "reason"}`` per mark
(:class:`comms.wire.marks.EpisodeMark`), appended durably when the episode ends and removed once
the cloud stored it (comms' :class:`~comms.robot.mark_sender.EpisodeMarkSender` sends them).
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict
from pathlib import Path

from comms.wire.marks import EpisodeMark
from foundation.durable import append_line, atomic_write_bytes, atomic_write_text


class EpisodeLog:
    """Hands out episode indices and logs finished episodes.

    Raises:
        ValueError: ``agent_state.json`` exists but is unreadable (at construction).
    """

    def __init__(self, directory: Path) -> None:
        self._state_file = directory / "agent_state.json"
        self._log_file = directory / "episodes.jsonl"
        self.next_index = self._load()

    def begin(self) -> int:
        """Take the next episode index (stored before the episode starts)."""
        index = self.next_index
        self.next_index += 1
        self._save()
        return index

    def forget(self) -> None:
        """The episode just begun never existed (nothing of it is kept): reuse its index."""
        self.next_index -= 1
        self._save()

    def log(
        self, index: int, task: str, steps: int, label: str | None, kind: str = "episode"
    ) -> None:
        """Append the line of a recorded episode (``label``: the operator's, or None;
        ``kind``: ``demonstration`` or ``episode``)."""
        line = {"episode_index": index, "task": task, "steps": steps, "label": label, "kind": kind}
        # Appended and fsynced: a restarted agent counts its demonstrations from it.
        append_line(self._log_file, json.dumps(line))

    def demonstrations(self) -> dict[str, int]:
        """Demonstrations kept (not discarded or rerecorded) so far, per task."""
        out: dict[str, int] = {}
        if not self._log_file.exists():
            return out
        for raw in self._log_file.read_text().splitlines():
            try:
                line = json.loads(raw)
            except json.JSONDecodeError:  # a line torn by a crash: its episode is not kept
                continue
            if line.get("kind") == "demonstration" and line.get("label") not in (
                "rerecord",
                "discard",
            ):
                out[line["task"]] = out.get(line["task"], 0) + 1
        return out

    def _load(self) -> int:
        if not self._state_file.exists():
            return 0
        try:
            return int(json.loads(self._state_file.read_text())["next_episode_index"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{self._state_file}: unreadable agent state ({exc})") from None

    def _save(self) -> None:
        data = json.dumps({"next_episode_index": self.next_index}).encode()
        atomic_write_bytes(self._state_file, data)


class MarkOutbox:
    """The robot's episode marks not yet stored by the cloud
    (``comms.robot.mark_sender.MarkOutbox``).

    Thread-safe: the control loop adds, the sender's thread reads and removes.

    Raises:
        ValueError: ``marks.jsonl`` exists but a line is unreadable (at construction).
    """

    def __init__(self, directory: Path) -> None:
        self._file = directory / "marks.jsonl"
        self._cond = threading.Condition()
        self._marks = self._load()

    def add(self, mark: EpisodeMark) -> None:
        """Keep ``mark`` durably (fsynced) until the cloud stored it."""
        with self._cond:
            append_line(self._file, json.dumps(asdict(mark)))
            self._marks.append(mark)
            self._cond.notify_all()

    def pending(self) -> list[EpisodeMark]:
        with self._cond:
            return list(self._marks)

    def sent(self, mark: EpisodeMark) -> None:
        with self._cond:
            if mark in self._marks:
                self._marks.remove(mark)
                lines = "".join(json.dumps(asdict(m)) + "\n" for m in self._marks)
                atomic_write_text(self._file, lines)

    def wait(self, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: bool(self._marks), timeout)

    def __len__(self) -> int:
        with self._cond:
            return len(self._marks)

    def _load(self) -> list[EpisodeMark]:
        if not self._file.exists():
            return []
        text = self._file.read_text()
        whole = text[: text.rfind("\n") + 1]  # a last line torn by a crash was never kept
        out = []
        for i, line in enumerate(whole.splitlines()):
            try:
                out.append(EpisodeMark(**json.loads(line)))
            except (ValueError, TypeError) as exc:
                raise ValueError(f"{self._file}: unreadable mark on line {i + 1} ({exc})") from None
        if len(whole) < len(text):
            atomic_write_text(self._file, whole)
        return out
