"""Which evaluations a run records: the source its spec's ``evaluation.on`` names (robots'
evaluation episodes, a simulator or none) under the run's
:class:`~runs.eval_record.EvaluationRecorder`. Choosing and building the source is one step of
a run's setup, kept apart from the driver that runs it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from cloud_learner.run_plan import RunPlan
from foundation.store.metadata_store import MetadataStore
from runs.eval_record import EvaluationRecorder, NoEvaluations
from runs.evaluations import SimulatorEvaluations
from runs.robot_evals import RobotEvaluations


def run_evaluations(
    store: MetadataStore,
    run_id: str,
    run_dir: Path,
    plan: RunPlan,
    *,
    robots: Callable[[], list[str]],
    robot_specs: Callable[[], dict[str, dict[str, Any]]],
    features: Any,
    orchestration: Any,
    on_event: Callable[..., None],
) -> EvaluationRecorder:
    """The run's success curve: robots' evaluation episodes or a simulator (evaluation.on).

    Args:
        store / run_id / run_dir: the run.
        plan: the run's plan (its spec and knobs).
        robots: the names of the run's robots now (robots' evaluation episodes).
        robot_specs: name -> enrolled spec of each leased robot (the simulator's kind).
        features: ``hal.compat.RunFeatures`` of the leased robots (the simulator's dims).
        orchestration: the cloud's ``orchestration:`` settings (the evaluator's niceness
            and backlog).
        on_event: records an event of the run (``kind, **data``).

    Raises:
        ValueError: the leased robots described no common driver kind (simulator).
    """
    from runs.evaluator import simulator_kind

    spec = plan.spec
    source: RobotEvaluations | SimulatorEvaluations | NoEvaluations
    if spec.evaluation.on == "none":
        source = NoEvaluations()
    elif spec.evaluation.on == "robots":
        source = RobotEvaluations(store, run_id, spec.tasks, robots, run_dir)
    else:
        o = orchestration
        source = SimulatorEvaluations(
            spec,
            simulator_kind(robot_specs()),
            (features.state_dim, features.action_dim),
            plan.params.eval_max_steps,
            o.evaluator_nice,
            o.eval_backlog,
        )
    return EvaluationRecorder(store, run_id, run_dir, source, on_event)
