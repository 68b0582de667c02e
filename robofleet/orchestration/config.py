"""Run orchestration settings (the ``orchestration:`` section, ``ROBOFLEET_ORCHESTRATION__*``).

Until ``robofleet.settings.Settings`` composes this section, :func:`orchestration_settings`
reads the same environment variables itself, so the names do not change when it does.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


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


class _FromEnvironment(OrchestrationSettings, BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ROBOFLEET_ORCHESTRATION__", extra="ignore")


def orchestration_settings(settings: Any) -> OrchestrationSettings:
    """``settings.orchestration`` when the settings have that section, else from the env.

    Raises:
        pydantic.ValidationError: a ``ROBOFLEET_ORCHESTRATION__*`` value is invalid.
    """
    section = getattr(settings, "orchestration", None)
    if isinstance(section, OrchestrationSettings):
        return section
    return OrchestrationSettings.model_validate(_FromEnvironment().model_dump())
