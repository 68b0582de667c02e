"""The robot's episode numbering and log, kept in its spool directory across restarts.

``agent_state.json`` holds ``{"next_episode_index": int}`` (written atomically and durably,
:func:`robofleet.durable.atomic_write_bytes`), so a restarted agent never reuses an
``episode_index`` the cloud may already hold. ``episodes.jsonl`` gets one line per recorded
episode: ``{"episode_index", "task", "steps", "label"}``.
"""

from __future__ import annotations

import json
from pathlib import Path

from robofleet.durable import atomic_write_bytes


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

    def log(self, index: int, task: str, steps: int, label: str | None) -> None:
        """Append the line of a recorded episode (``label``: the operator's, or None)."""
        line = {"episode_index": index, "task": task, "steps": steps, "label": label}
        # A record for people, not fsynced: the steps themselves are durable in the spool.
        with open(self._log_file, "a") as f:
            f.write(json.dumps(line) + "\n")

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
