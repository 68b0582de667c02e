"""When a run has reached what its spec's ``stop`` section asks: :func:`reached`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from foundation.runspec import StopSpec


def reached(stop: StopSpec, elapsed_s: float, progress: Mapping[str, Any]) -> str | None:
    """The reason the run is done, or None while it goes on.

    Args:
        stop: the spec's stop conditions (``minutes``, ``env_steps``, ``target_success``; each
            None when unset).
        elapsed_s: the run's clock (paused time left out), seconds.
        progress: the live figures (``env_steps``, ``success_mean``).
    """
    if stop.minutes is not None and elapsed_s >= stop.minutes * 60:
        return f"reached {stop.minutes} minutes"
    if stop.env_steps is not None and progress.get("env_steps", 0) >= stop.env_steps:
        return f"reached {stop.env_steps} env steps"
    if stop.target_success is not None and progress.get("success_mean", 0.0) >= stop.target_success:
        return f"reached success {stop.target_success}"
    return None
