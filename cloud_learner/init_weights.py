"""Starting weights of a fresh run: an earlier run's version or checkpoint, loaded into the
new run's policy before its warm start, or refused naming what does not fit.

Sources (:func:`read_initial`):

* a weights file (``.safetensors``: a published version, as ``comms.cloud.weight_file`` keeps them
  and a run promotes them; its policy card says what it is);
* a robofleet checkpoint directory (``checkpoints/step-N``: ``state.json`` and
  ``tensors.safetensors``; the policy's tensors of the algorithm's state, and the run spec's
  fields the checkpoint was made from), or a run directory / its ``checkpoints/`` (the
  latest).

(A LeRobot ``pretrained_model`` directory is loaded by the LeRobot adapter itself, config
and weights: ``cloud_learner.policies.lerobot_adapter.make_lerobot_policy``.)

Tensors are read with safetensors, never unpickled. A mismatch is refused with
:class:`InitialWeightsError` naming each tensor (both shapes) and the settings behind it: the
spec keys that differ from the source's (``policy.hidden_sizes: init has [64, 64], this run
has [128, 128]``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from cloud_learner.checkpoint import CheckpointError, CheckpointManager, config_mismatch
from cloud_learner.policies.base import describe_mismatch
from cloud_learner.policy_card import PolicyCard, split_card


class InitialWeightsError(ValueError):
    """Starting weights that cannot be read or do not fit the run's policy (named)."""


@dataclass
class InitialWeights:
    """What a source gives a new run.

    Attributes:
        source: the path read, for messages and the run's events.
        tensors: the policy's tensors (``state_dict`` names).
        card: the policy card of a weights file (None for a checkpoint).
        spec: the run spec's fields the source was made from (a checkpoint's; a card's
            sizes under the spec's key names), for naming what differs.
    """

    source: str
    tensors: dict[str, torch.Tensor]
    card: PolicyCard | None = None
    spec: dict[str, Any] = field(default_factory=dict)


def read_initial(path: str | Path) -> InitialWeights:
    """Read starting weights from ``path`` (module docstring for the forms).

    Raises:
        InitialWeightsError: nothing there, a form it is not, or unreadable files.
    """
    p = Path(path)
    if p.is_file() and p.suffix == ".safetensors":
        return _from_weights_file(p)
    if p.is_dir():
        if (p / "state.json").is_file():
            return _from_checkpoint(p)
        run_dir = p.parent if p.name == "checkpoints" else p
        latest = CheckpointManager(run_dir).latest()
        if latest is not None:
            return _from_checkpoint(latest)
    raise InitialWeightsError(
        f"{p} is no weights file (.safetensors), robofleet checkpoint (state.json and "
        "tensors.safetensors) or run directory with checkpoints"
    )


def _from_weights_file(path: Path) -> InitialWeights:
    try:
        raw = load_file(str(path))
        card, tensors = split_card(raw)
    except Exception as exc:  # safetensors raises its own error type for a bad header
        raise InitialWeightsError(f"{path} is unreadable: {exc}") from None
    return InitialWeights(str(path), tensors, card, card_spec(card) if card else {})


def _from_checkpoint(path: Path) -> InitialWeights:
    try:
        state = CheckpointManager(path.parent.parent).load(path)
    except CheckpointError as exc:
        raise InitialWeightsError(str(exc)) from None
    policy = state.algorithm.get("policy")
    if not isinstance(policy, Mapping) or not policy:
        raise InitialWeightsError(f"checkpoint {path} holds no policy tensors")
    tensors = {k: v for k, v in policy.items() if isinstance(v, torch.Tensor)}
    return InitialWeights(str(path), tensors, None, dict(state.spec))


def card_spec(card: PolicyCard) -> dict[str, Any]:
    """A card's sizes under the run spec's key names (what a mismatch names)."""
    spec = card.spec
    return {
        "policy": {
            "hidden_sizes": spec.widths,
            "chunk_size": spec.chunk_size,
            "cameras": [k.removeprefix("observation.images.") for k in spec.image_keys],
        },
        "robots": {"observation.state": spec.state_dim, "action": spec.action_dim},
        "tasks": spec.num_tasks,
    }


def load_into(
    policy: torch.nn.Module, initial: InitialWeights, run_spec: Mapping[str, Any]
) -> None:
    """Load ``initial`` into ``policy`` (all or nothing).

    Args:
        policy: the new run's freshly built policy.
        initial: from :func:`read_initial`.
        run_spec: this run's spec fields in the form of ``initial.spec`` (``RunPlan.model_spec``
            for a checkpoint; :func:`card_spec` of this run's card for a weights file).

    Raises:
        InitialWeightsError: naming each tensor that does not fit (both shapes) and the spec
            keys behind the difference.
    """
    mine = policy.state_dict()
    problems = describe_mismatch(
        mine, initial.tensors, expected_as="this run", got_as=f"{Path(initial.source).name}"
    )
    if not problems:
        policy.load_state_dict(dict(initial.tensors), strict=True)
        return
    behind = _differences(initial.spec, run_spec)
    why = f" (behind it: {'; '.join(behind)})" if behind else ""
    raise InitialWeightsError(
        f"starting weights {initial.source} do not fit this run's policy: "
        + "; ".join(problems)
        + why
    )


def _differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Spec keys whose values differ (only keys both sides have: a card lacks most)."""
    shared = {k: saved[k] for k in saved if k in current}
    mine = {k: current[k] for k in shared}
    return [d.replace("checkpoint has", "init has") for d in config_mismatch(shared, mine)]
