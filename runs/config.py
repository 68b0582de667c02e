"""Run orchestration settings (the ``orchestration:`` section, ``ROBOFLEET_ORCHESTRATION__*``)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class OrchestrationSettings(BaseModel):
    """Supervision of a run's learner process, robot start-up and evaluation."""

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
            "The same limit until the run's first policy version (start-up, state "
            "normalisation and the behaviour-cloning warm start may be slow on a small "
            "machine) and from each restart until the learner's first batch (its imports "
            "and checkpoint load)."
        ),
    )
    robots_ready_timeout_s: float = Field(
        default=180.0,
        gt=0,
        description=(
            "How long a run waits for its assigned robots to act in it (each robot computer "
            "builds the run's driver, policy, uplink and weight subscription) before its clock "
            "starts; one still starting then joins late (event robot.slow_start)."
        ),
    )
    release_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description=(
            "How long a run's end waits for its robots to leave it (finish the episode, drain "
            "the spool, report idle) before the learner stops (event robot.release_timeout)."
        ),
    )
    eval_backlog: int = Field(
        default=120,
        ge=1,
        description=(
            "Policy snapshots that may wait for the evaluator; beyond it the oldest waiting one "
            "is dropped (event run.evaluation_dropped). 120 covers 20 minutes of 10-second "
            "snapshots; each holds one version's weights."
        ),
    )
    auto_resume: bool = Field(
        default=True,
        description=(
            "On start, resume the runs a previous cloud left running (stopped or crashed). "
            "False marks them crashed instead, for a one-click resume from the dashboard or "
            "`robofleet resume RUN`; `robofleet cloud --no-auto-resume` sets it for one start."
        ),
    )
    evaluator_nice: int = Field(
        default=10,
        ge=0,
        le=19,
        description=(
            "Niceness of the evaluation process: evaluation is the measuring instrument, so it "
            "takes only CPU the robots and the learner leave; its results come later, each "
            "stamped with the time its snapshot was taken."
        ),
    )
