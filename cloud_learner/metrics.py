"""Learner metrics: TensorBoard event files plus a JSON-lines file, both gap-free on resume.

On resume from a checkpoint at step S, both sinks drop whatever was logged after S (those
updates are redone), so every metric's steps continue S+1, S+2, ... without gap or duplicate.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

from foundation.durable import atomic_write_text


class MetricsWriter:
    """Writes ``{name: value}`` at a step to ``<run_dir>/tensorboard`` and ``metrics.jsonl``."""

    def __init__(self, run_dir: Path | str, resume_step: int | None = None) -> None:
        run_dir = Path(run_dir)
        self.jsonl_path = run_dir / "metrics.jsonl"
        if resume_step is not None:
            _truncate_after(self.jsonl_path, resume_step)
        # purge_step drops TensorBoard events at or beyond it, written before the crash.
        purge = None if resume_step is None else resume_step + 1
        self.tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"), purge_step=purge)
        # Line-buffered: the dashboard and tests see each row at once; fsync at checkpoints.
        self._jsonl = open(self.jsonl_path, "a", buffering=1)  # noqa: SIM115 - closed in close()

    def write(self, step: int, metrics: Mapping[str, float], prefix: str = "learner") -> None:
        for name, value in metrics.items():
            self.tb.add_scalar(f"{prefix}/{name}", value, step)
        self._jsonl.write(json.dumps({"step": step, "prefix": prefix, **metrics}) + "\n")

    def flush(self) -> None:
        self.tb.flush()
        self._jsonl.flush()
        os.fsync(self._jsonl.fileno())

    def close(self) -> None:
        self.flush()
        self.tb.close()
        self._jsonl.close()


def _truncate_after(path: Path, step: int) -> None:
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if int(json.loads(line)["step"]) <= step:
                kept.append(line)
        except (ValueError, KeyError):
            continue  # a torn last line from the crash
    atomic_write_text(path, "".join(f"{line}\n" for line in kept))


def read_metrics(run_dir: Path | str, prefix: str = "learner") -> list[dict[str, float]]:
    """The JSON-lines metrics of a run (for tests and the dashboard)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("prefix") == prefix]
