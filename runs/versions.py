"""The one writer of a run's version rows: ``PolicyVersion`` and ``Checkpoint`` in the
metadata store (with their ``learner.published`` / ``learner.checkpoint`` events), from what
the learner process leaves in the run directory. The learner itself has no store access.

Sources, both durable before they are read here:

* the learner's journal of published versions (``cloud_learner.loop.PUBLISHED``: one fsynced
  JSON line per version, ``{"version", "learner_step", "num_bytes"}``), read up to the newest
  version of ``weights/`` (a line whose file is not out yet waits for the next poll);
* its complete checkpoints (``cloud_learner.checkpoint.CheckpointManager``).

Idempotent: a row already there (recorded before the cloud restarted) is left as it is, so a
resumed run finds every version and checkpoint once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from cloud_learner.checkpoint import CheckpointManager
from cloud_learner.loop import PUBLISHED
from comms.cloud.weight_file import latest_version
from foundation.store.metadata_store import MetadataStore
from foundation.store.models import Checkpoint, PolicyVersion

log = logging.getLogger(__name__)


class VersionRecorder:
    """Records a run's published versions and checkpoints as the learner writes them.

    Args:
        store: the metadata store.
        run_id / run_dir: the run (its ``weights/``, journal and ``checkpoints/``).
    """

    def __init__(self, store: MetadataStore, run_id: str, run_dir: Path) -> None:
        self.store, self.run_id, self.run_dir = store, run_id, run_dir
        self._journal = run_dir / PUBLISHED
        self._offset = 0  # bytes of the journal taken
        self._checkpoints = CheckpointManager(run_dir)
        # High-water marks, not sets: metadata retention thins old rows (foundation.store.
        # retention), and a version or checkpoint below the mark was recorded, maybe since pruned.
        with store.session() as s:
            self._version_mark = int(
                s.scalar(
                    select(func.max(PolicyVersion.version)).where(PolicyVersion.run_id == run_id)
                )
                or 0
            )
            self._step_mark = int(
                s.scalar(
                    select(func.max(Checkpoint.learner_step)).where(Checkpoint.run_id == run_id)
                )
                or -1
            )

    def poll(self) -> None:
        """Record what the learner wrote since the last poll."""
        for entry in self._new_versions():
            self._record("published", entry)
        for path in self._checkpoints.list():
            step = int(path.name.removeprefix("step-"))
            if step <= self._step_mark:
                continue
            try:
                version = self._checkpoints.policy_version(path)
            except (OSError, ValueError, KeyError) as exc:  # removed meanwhile, or unreadable
                log.warning("checkpoint %s not recorded: %s", path, exc)
                continue
            self._record(
                "checkpoint", {"learner_step": step, "policy_version": version, "path": str(path)}
            )

    def _new_versions(self) -> list[dict[str, Any]]:
        """Journal entries of versions out in ``weights/``, from the last one taken; a line
        torn by a crash (no JSON) is skipped, one not out yet is left for the next poll."""
        try:
            with self._journal.open("rb") as f:
                f.seek(self._offset)
                tail = f.read()
        except FileNotFoundError:
            return []
        shipped = latest_version(self.run_dir / "weights")
        out = []
        for line in tail.splitlines(keepends=True):
            if not line.endswith(b"\n"):
                break  # being written
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                self._offset += len(line)
                continue
            if int(entry["version"]) > shipped:
                break
            self._offset += len(line)
            out.append(entry)
        return out

    def _record(self, kind: str, data: Mapping[str, Any]) -> None:
        row: PolicyVersion | Checkpoint
        if kind == "published":
            version = int(data["version"])
            if version <= self._version_mark:
                return
            row = PolicyVersion(
                run_id=self.run_id,
                version=version,
                learner_step=int(data["learner_step"]),
                num_bytes=int(data["num_bytes"]),
            )
        else:
            row = Checkpoint(
                run_id=self.run_id,
                learner_step=int(data["learner_step"]),
                policy_version=int(data["policy_version"]),
                path=str(data["path"]),
            )
        with self.store.session() as s:
            s.add(row)
            self.store.record_event(f"learner.{kind}", run_id=self.run_id, session=s, **dict(data))
        if kind == "published":
            self._version_mark = int(data["version"])
        else:
            self._step_mark = int(data["learner_step"])
