"""Atomic learner checkpoints: safetensors for tensors, JSON for everything else. No pickle.

Layout of one checkpoint (``<run_dir>/checkpoints/step-<learner_step>/``)::

    tensors.safetensors   every tensor of the state (model, optimizers, RNG of torch)
    state.json            the rest: counters, config (and the run spec's fields it was made
                          from), python/numpy RNG, sampler state, with {"__tensor__": name}
                          where a tensor was

Writing: a temp dir ``.tmp-step-*`` is filled, every file and the dir fsynced, renamed into
place, the parent fsynced; then all but the last ``keep`` checkpoints are removed. A crash at
any moment leaves either the previous checkpoints or the new one, never a half one (temp dirs
are ignored and swept on the next start).
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from cloud_learner.policies.base import describe_mismatch
from foundation.durable import fsync_dir, fsync_tree

CHECKPOINT_FORMAT = 1


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable or does not fit this run."""


class RunDirHasCheckpoints(CheckpointError):
    """The run directory already has checkpoints and resuming was not asked for."""


class IncompatibleCheckpoint(CheckpointError):
    """The checkpoint was written by a run with a different config or model."""


@dataclass
class CheckpointState:
    """Everything the learner needs to continue bit-exactly.

    ``spec``: the user's settings ``config`` was made from (a run spec's fields), so that a
    resume refused for a config difference names the keys the user wrote; empty in
    checkpoints written before it was kept.
    """

    learner_step: int
    policy_version: int
    algorithm: dict[str, Any]
    config: dict[str, Any]
    sampler: dict[str, Any] = field(default_factory=dict)
    counters: dict[str, Any] = field(default_factory=dict)
    rng: dict[str, Any] = field(default_factory=dict)
    spec: dict[str, Any] = field(default_factory=dict)


# -- RNG -------------------------------------------------------------------------------------


def capture_rng() -> dict[str, Any]:
    """Python, numpy (global) and torch (CPU and CUDA) generator states."""
    np_state = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np_state,
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["torch_cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: Mapping[str, Any]) -> None:
    """Inverse of :func:`capture_rng`."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "torch_cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(list(state["torch_cuda"]))


# -- flattening nested state into (JSON, tensors) --------------------------------------------


def _flatten(obj: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        tensors[path] = obj.detach().cpu().contiguous().clone()
        return {"__tensor__": path}
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": obj.tolist(), "dtype": str(obj.dtype)}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, Mapping):
        if all(isinstance(k, str) for k in obj) and "__tensor__" not in obj:
            return {k: _flatten(v, f"{path}/{k}", tensors) for k, v in obj.items()}
        return {"__items__": [[k, _flatten(v, f"{path}/{k}", tensors)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"__tuple__": [_flatten(v, f"{path}/{i}", tensors) for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_flatten(v, f"{path}/{i}", tensors) for i, v in enumerate(obj)]
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    raise CheckpointError(f"cannot checkpoint {path}: unsupported type {type(obj).__name__}")


def _unflatten(obj: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            return tensors[obj["__tensor__"]]
        if "__ndarray__" in obj:
            return np.asarray(obj["__ndarray__"], dtype=obj["dtype"])
        if "__tuple__" in obj:
            return tuple(_unflatten(v, tensors) for v in obj["__tuple__"])
        if "__items__" in obj:
            return {k: _unflatten(v, tensors) for k, v in obj["__items__"]}
        return {k: _unflatten(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_unflatten(v, tensors) for v in obj]
    return obj


# -- the manager -----------------------------------------------------------------------------


class CheckpointManager:
    """Saves, lists and loads checkpoints of one run; see the module docstring."""

    def __init__(self, run_dir: Path | str, keep: int = 3) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.directory = Path(run_dir) / "checkpoints"
        self.keep = keep

    def list(self) -> list[Path]:
        """Complete checkpoints, oldest first."""
        if not self.directory.exists():
            return []
        done = [p for p in self.directory.glob("step-*") if (p / "state.json").exists()]
        return sorted(done, key=lambda p: int(p.name.removeprefix("step-")))

    def latest(self) -> Path | None:
        found = self.list()
        return found[-1] if found else None

    @staticmethod
    def policy_version(path: Path) -> int:
        """The policy version a complete checkpoint was taken at (its ``state.json`` alone).

        Raises:
            OSError: the checkpoint is gone (removed by newer ones) or unreadable.
        """
        return int(json.loads((path / "state.json").read_text())["policy_version"])

    def sweep_temp(self) -> None:
        """Remove half-written temp dirs left by a crash."""
        if self.directory.exists():
            for tmp in self.directory.glob(".tmp-*"):
                shutil.rmtree(tmp, ignore_errors=True)

    def save(self, state: CheckpointState) -> Path:
        """Write ``state`` atomically; returns the checkpoint dir."""
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.directory / f"step-{state.learner_step:010d}"
        tmp = self.directory / f".tmp-step-{state.learner_step:010d}-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        tensors: dict[str, torch.Tensor] = {}
        doc = {
            "format": CHECKPOINT_FORMAT,
            "learner_step": state.learner_step,
            "policy_version": state.policy_version,
            "config": state.config,
            "spec": state.spec,
            "counters": _flatten(state.counters, "counters", tensors),
            "sampler": _flatten(state.sampler, "sampler", tensors),
            "rng": _flatten(state.rng, "rng", tensors),
            "algorithm": _flatten(state.algorithm, "algorithm", tensors),
        }
        try:
            try:
                save_file(tensors, str(tmp / "tensors.safetensors"))
            except Exception as exc:  # safetensors' own error type for an I/O failure
                if isinstance(exc, OSError) or "os error 28" not in str(exc):
                    raise
                raise OSError(errno.ENOSPC, f"{tmp}: no space left on device") from exc
            (tmp / "state.json").write_text(json.dumps(doc))
            fsync_tree(tmp)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)  # no half checkpoint holds the space
            raise
        if final.exists():  # the same step again (e.g. re-run after resume): replace it
            shutil.rmtree(final)
        os.rename(tmp, final)
        fsync_dir(self.directory)
        for old in self.list()[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        fsync_dir(self.directory)
        return final

    def load(self, path: Path | None = None) -> CheckpointState:
        """Read a checkpoint (default: the latest).

        Raises:
            CheckpointError: none exists, or its files are unreadable.
        """
        path = path or self.latest()
        if path is None:
            raise CheckpointError(f"no checkpoint in {self.directory}")
        try:
            doc = json.loads((path / "state.json").read_text())
            tensors = load_file(str(path / "tensors.safetensors"))
        except Exception as exc:  # OSError, JSON and safetensors header errors alike
            raise CheckpointError(f"checkpoint {path} is unreadable: {exc}") from exc
        if doc.get("format") != CHECKPOINT_FORMAT:
            raise CheckpointError(
                f"checkpoint {path} has format {doc.get('format')}, expected {CHECKPOINT_FORMAT}"
            )
        return CheckpointState(
            learner_step=int(doc["learner_step"]),
            policy_version=int(doc["policy_version"]),
            config=doc["config"],
            spec=doc.get("spec", {}),
            counters=_unflatten(doc["counters"], tensors),
            sampler=_unflatten(doc["sampler"], tensors),
            rng=_unflatten(doc["rng"], tensors),
            algorithm=_unflatten(doc["algorithm"], tensors),
        )


def config_mismatch(saved: Any, current: Any, path: str = "") -> list[str]:
    """Dotted keys whose values differ between two JSON-like configs, with both values."""
    if isinstance(saved, dict) and isinstance(current, dict):
        out: list[str] = []
        for key in sorted(set(saved) | set(current)):
            sub = f"{path}.{key}" if path else key
            if key not in saved:
                out.append(f"{sub}: not in checkpoint (now {current[key]!r})")
            elif key not in current:
                out.append(f"{sub}: in checkpoint ({saved[key]!r}) but not in this config")
            else:
                out.extend(config_mismatch(saved[key], current[key], sub))
        return out
    if saved != current:
        return [f"{path}: checkpoint has {saved!r}, this run has {current!r}"]
    return []


def tensor_mismatch(current: Mapping[str, Any], saved: Mapping[str, Any]) -> list[str]:
    """The tensors of an algorithm's state (``Algorithm.state_dict()``) that a checkpoint's
    (``saved``) cannot fill, each named by its dotted path with both shapes, e.g.
    ``policy.head.0.weight: this run shape (256, 39), checkpoint (64, 39)``, or as missing
    from either side. Compared: the state's tensors and its modules' state dicts (mappings of
    tensors only); not an optimizer's state, which a fresh optimizer does not have yet."""
    problems: list[str] = []
    for key in sorted(current):
        mine, theirs = current[key], saved.get(key)
        if isinstance(mine, torch.Tensor):
            mine, theirs, prefix = {key: mine}, {key: theirs}, ""
        elif _module_state(mine):
            prefix = f"{key}."
        else:
            continue
        theirs = theirs if isinstance(theirs, Mapping) else {}
        theirs = {k: v for k, v in theirs.items() if isinstance(v, torch.Tensor)}
        problems.extend(
            describe_mismatch(
                mine, theirs, prefix=prefix, expected_as="this run", got_as="checkpoint"
            )
        )
    return problems


def _module_state(value: Any) -> bool:
    return (
        isinstance(value, Mapping)
        and bool(value)
        and all(isinstance(v, torch.Tensor) for v in value.values())
    )


def check_resumable(
    path: Path,
    saved: CheckpointState,
    algorithm: Mapping[str, Any],
    config: Mapping[str, Any],
    spec: Mapping[str, Any] | None = None,
) -> None:
    """Refuse a checkpoint that does not fit this run: its tensors against ``algorithm`` (this
    run's fresh ``Algorithm.state_dict()``), its config against ``config`` (every key of it).

    Raises:
        IncompatibleCheckpoint: naming each tensor that does not fit, with both shapes and
            the settings behind it in brackets (the keys of ``spec`` that differ from the
            checkpoint's spec, e.g. ``policy.hidden_sizes: checkpoint has [64, 64], this run
            has [256, 256]``; the config's keys when either spec is missing), then every
            config key that differs, with both values.
    """
    tensors = tensor_mismatch(algorithm, saved.algorithm)
    differs: list[str] = []
    for name in sorted(config):
        differs.extend(config_mismatch(saved.config.get(name), config.get(name), name))
    if not tensors and not differs:
        return
    behind = (config_mismatch(saved.spec, dict(spec)) if saved.spec and spec else []) or differs
    parts = []
    if tensors:
        why = f" ({'; '.join(behind)})" if behind else ""
        parts.append(
            "its tensors do not fit this run's model: " + "; ".join(t + why for t in tensors)
        )
    if differs:
        parts.append("the config differs from the checkpoint's in " + "; ".join(differs))
    raise IncompatibleCheckpoint(f"cannot resume from checkpoint {path.name}: " + "; ".join(parts))
