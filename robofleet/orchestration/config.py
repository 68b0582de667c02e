"""Run orchestration settings (the ``orchestration:`` section, ``ROBOFLEET_ORCHESTRATION__*``)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class OrchestrationSettings(BaseModel):
    """Supervision of a run's learner process."""

    learner_hang_s: float = Field(
        default=120.0,
        gt=0,
        description=(
            "A learner that is alive but has made no progress (no batch taken, no update) for "
            "this many seconds is hung: SIGKILLed and restarted from its last checkpoint. "
            "Sized for a loaded 2-core machine (an update there takes well under a second)."
        ),
    )
    learner_warmup_hang_s: float = Field(
        default=600.0,
        gt=0,
        description=(
            "The same limit until the run's first policy version: start-up, state "
            "normalisation and the behaviour-cloning warm start may be slow on a small machine."
        ),
    )
