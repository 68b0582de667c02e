"""What a run tells each of its robots: the :class:`~edge_agent.assignment.Assignment` built
from the run's plan and the cloud's edge defaults, kept apart from the driver that sends it so
the run's life and the robots' instructions each read on their own.
"""

from __future__ import annotations

from typing import Any

from cloud_learner.run_plan import RunPlan
from edge_agent.assignment import Assignment, run_edge_settings
from foundation.runspec import RunSpec


def run_assignment(run_id: str, plan: RunPlan, edge: Any) -> Assignment:
    """What every robot of the run is told (each gets its own seed).

    Args:
        run_id: the run.
        plan: the run's plan (its spec, knobs and algorithm's needs).
        edge: the cloud's fleet-wide edge defaults (``settings.edge``).
    """
    spec, params = plan.spec, plan.params
    evaluation = spec.evaluation
    return Assignment(
        run_id=run_id,
        tasks=list(spec.tasks),
        max_episode_steps=params.max_episode_steps,
        hidden=spec.policy.hidden_sizes[0],
        terminate_on_success=plan.terminate_on_success,  # e.g. RECAP's
        needs_operator=plan.needs_operator,
        reward_source=spec.reward.source,
        help=help_assignment(spec),
        edge=run_edge_settings(
            edge,
            params.control_hz,
            evaluate_every=evaluation.every_episodes if evaluation.on == "robots" else 0,
        ),
    )


def help_assignment(spec: RunSpec) -> dict[str, Any]:
    """The robots' ``help:`` (none when they never ask); ``on_call`` when the run has
    fewer people than robots (``edge_agent.on_call``)."""
    h = spec.help
    if h.risk == "none":
        return {}
    cloud_only = {"probe_horizon", "probe_every_updates", "probe_episodes", "operators"}
    out = h.model_dump(exclude=cloud_only | {"simulated_operators"})
    out["on_call"] = h.operators is not None and h.operators < spec.robots.count
    return out
