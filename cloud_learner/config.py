"""Learner settings (the ``learner:`` section, ``ROBOFLEET_LEARNER__*``)."""

from typing import Literal

from pydantic import BaseModel, Field


class LearnerSettings(BaseModel):
    """Where the learner trains and how it checkpoints."""

    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto", description="'auto' picks CUDA when present, else CPU."
    )
    keep_checkpoints: int = Field(default=3, ge=1, description="Checkpoints kept per run.")
