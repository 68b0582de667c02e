"""Where a run's policy starts: ``policy.init_checkpoint``, ``policy.init_from_run``, and the
promoted version a finished run leaves for the next one.

* ``policy.init_checkpoint``: a LeRobot ``pretrained_model`` directory (``lerobot-*`` kinds:
  the learner builds the policy from it, config and weights), a weights file
  (``.safetensors``, a published version), a robofleet checkpoint directory, or a run
  directory (its latest checkpoint).
* ``policy.init_from_run``: that run's **promoted** version: ``<run_dir>/promoted.safetensors``
  (and the ``promoted`` flag of its ``PolicyVersion`` row). A run that ends promotes the
  version its evaluations speak best for (``runs.promotion``), none without evaluations;
  ``robofleet run promote RUN --version N`` promotes any version whose weights are still on
  disk (``promoted.json`` says ``"by": "manual"``).

The learner loads the weights before its warm start and refuses (exit 4, the run crashes
with the reason at once) weights that do not fit, naming each tensor and the spec keys behind
it (``cloud_learner.init_weights``). Launch validation here checks only what is cheap: that the
source exists and is of a form this kind of policy starts from.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sqlalchemy import update

from cloud_learner.run_plan import RunPlan, is_lerobot_dir
from comms.cloud.weight_file import weight_file_name
from foundation.durable import atomic_write_bytes, atomic_write_text
from foundation.runspec import RunSpec
from foundation.store.metadata_store import MetadataStore
from foundation.store.models import PolicyVersion

PROMOTED = "promoted.safetensors"
PROMOTED_INFO = "promoted.json"


class PromotionError(ValueError):
    """A version cannot be promoted (its run or weights are gone); the message says which."""


def check_start(
    spec: RunSpec,
    plan: RunPlan | None,
    features: dict[str, Any] | None,
    data_dir: Path,
    store: MetadataStore,
) -> dict[str, str]:
    """Errors of the spec's starting weights: ``{"policy.init_checkpoint" | "policy.
    init_from_run": why}``; empty when they can be tried."""
    p = spec.policy
    if p.init_from_run is not None:
        run = store.get_run(p.init_from_run)
        if run is None:
            return {"policy.init_from_run": f"no run {p.init_from_run!r}"}
        if not (Path(run.run_dir) / PROMOTED).is_file():
            return {
                "policy.init_from_run": (
                    f"run {p.init_from_run} has no promoted version (a run promotes its "
                    "best evaluated version when it ends, none without evaluations; "
                    "robofleet run promote RUN --version N picks one)"
                )
            }
    if p.init_checkpoint is not None:
        path = Path(p.init_checkpoint).expanduser()
        lerobot_kind = p.kind.startswith("lerobot-")
        if not path.exists():
            return {"policy.init_checkpoint": f"{path} does not exist"}
        if is_lerobot_dir(str(path)) and not lerobot_kind:
            return {
                "policy.init_checkpoint": (
                    f"{path} is a LeRobot pretrained_model: it starts lerobot-* policies, "
                    f"not {p.kind!r}"
                )
            }
        if lerobot_kind and not is_lerobot_dir(str(path)) and path.suffix != ".safetensors":
            return {
                "policy.init_checkpoint": (
                    f"{path} is no LeRobot pretrained_model directory (config.json and "
                    "model.safetensors) nor a weights file of an earlier lerobot run"
                )
            }
        if not (is_lerobot_dir(str(path)) or _robofleet_weights(path)):
            return {
                "policy.init_checkpoint": (
                    f"{path} is no weights file (.safetensors), robofleet checkpoint or run "
                    "directory with checkpoints"
                )
            }
    return {}


def _robofleet_weights(path: Path) -> bool:
    if path.is_file():
        return path.suffix == ".safetensors"
    if (path / "state.json").is_file():
        return True
    checkpoints = path if path.name == "checkpoints" else path / "checkpoints"
    return checkpoints.is_dir() and any(checkpoints.glob("step-*/state.json"))


def initial_weights_path(spec: RunSpec, data_dir: Path, store: MetadataStore) -> Path | None:
    """The weights the run's learner loads before its warm start (None: from scratch, or a
    LeRobot directory the policy is built from)."""
    p = spec.policy
    if p.init_from_run is not None:
        run = store.get_run(p.init_from_run)
        return None if run is None else Path(run.run_dir) / PROMOTED
    if p.init_checkpoint is not None and not is_lerobot_dir(p.init_checkpoint):
        return Path(p.init_checkpoint).expanduser()
    return None


def promote(
    store: MetadataStore,
    run_id: str,
    run_dir: Path,
    version: int,
    blob: bytes,
    based_on: Mapping[str, Any] | None = None,
) -> None:
    """Make ``version`` (its safetensors ``blob``) the run's promoted version: the file
    ``promoted.safetensors`` (fsynced, replaced atomically), ``promoted.json`` (``version``
    and what the promotion was ``based_on``: default ``{"by": "manual"}``; a run's own end:
    its evaluation evidence, ``runs.promotion.based_on``) and the store's flag."""
    basis = dict(based_on or {"by": "manual"})
    atomic_write_bytes(run_dir / PROMOTED, blob)
    atomic_write_text(run_dir / PROMOTED_INFO, json.dumps({"version": version, **basis}))
    with store.session() as s:
        s.execute(
            update(PolicyVersion).where(PolicyVersion.run_id == run_id).values(promoted=False)
        )
        s.execute(
            update(PolicyVersion)
            .where(PolicyVersion.run_id == run_id, PolicyVersion.version == version)
            .values(promoted=True)
        )
    store.record_event("run.promoted", run_id=run_id, version=version, **basis)


def promote_from_disk(store: MetadataStore, run_id: str, version: int | None = None) -> int:
    """Promote ``version`` of ``run_id`` (default: its newest) from its weights directory;
    returns the version.

    Raises:
        PromotionError: no such run, or that version's weights are no longer on disk (the
            directory keeps the last few).
    """
    run = store.get_run(run_id)
    if run is None:
        raise PromotionError(f"no run {run_id!r}")
    weights = Path(run.run_dir) / "weights"
    kept = sorted(int(f.name[1:9]) for f in weights.glob("v*.safetensors"))
    if not kept:
        raise PromotionError(f"run {run_id} has no weights on disk")
    chosen = kept[-1] if version is None else version
    path = weights / weight_file_name(chosen)
    if not path.is_file():
        raise PromotionError(
            f"version {chosen} of run {run_id} is no longer on disk (kept: {kept})"
        )
    promote(store, run_id, Path(run.run_dir), chosen, path.read_bytes())
    return chosen


def promoted_version(run_dir: Path) -> int | None:
    """The run's promoted version (``promoted.json``), None when it has none."""
    try:
        return int(json.loads((run_dir / PROMOTED_INFO).read_text())["version"])
    except (FileNotFoundError, KeyError, ValueError):
        return None


def read_promotion(run_dir: Path) -> dict[str, Any] | None:
    """``promoted.json``: the promoted ``version`` and what it was based on (None: none)."""
    try:
        return dict(json.loads((run_dir / PROMOTED_INFO).read_text()))
    except (FileNotFoundError, ValueError):
        return None
