"""HG-DAgger runs of the full system on blind Meta-World robots, one per operator configuration.

Part of ``robofleet bench operators``. Each run is what ``robofleet bench rewards`` runs (a
fresh local cloud with simulated robot computers, ``robofleet.bench.efficiency``), with
``algorithm: hg-dagger`` and one way of spending people:

* ``risk`` (a): robots ask for help from the risk signal (``help.risk: ensemble``); the run
  has ``operators`` people (default 1), played by the cloud (``help.simulated_operators``),
  each serving one robot at a time: assigned the highest-risk waiting request, they take the
  robot over for ``on_call_steps`` steps and hand back (``edge_agent.on_call``);
* ``dedicated`` (b): a person at each robot (``help.operators`` unset): the scripted person
  takes over whenever HG-DAgger's gate says, all run long;
* ``random`` (c): as ``risk`` but requests come at random times (``help.risk: random``) at the
  rate of ``risk``'s requests per robot step, so about as many.

The robots report neither reward nor success: the person at a robot labels each episode from
the scene (``edge_agent.simulated_person``); ground-truth success over time comes from the
cloud's simulator evaluation (measurement only).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from robofleet.bench.reward_runs import late_success

CONFIGS = ("risk", "dedicated", "random")
BLIND = {"reward": "none", "detects_success": False}


def help_section(
    config: str,
    *,
    operators: int,
    threshold: float,
    random_rate: float,
    on_call_steps: int,
    timeout_s: float,
) -> dict[str, Any]:
    """The run's ``help:`` of ``config`` (module docstring).

    Raises:
        ValueError: an unknown configuration.
    """
    if config == "dedicated":
        return {}
    if config not in CONFIGS:
        raise ValueError(f"unknown operator configuration {config!r}; known: {list(CONFIGS)}")
    common = {
        "operators": operators,
        "simulated_operators": True,
        "on_call_steps": on_call_steps,
        "while_waiting": "continue",  # the policy goes on while the request waits
        "timeout_s": timeout_s,
        "cooldown_steps": 20,
    }
    if config == "risk":
        return {**common, "risk": "ensemble", "threshold": threshold, "hysteresis": 0.0}
    return {**common, "risk": "random", "random_rate": random_rate, "threshold": 0.5}


def run_spec(
    config: str,
    help_doc: Mapping[str, Any],
    *,
    task: str,
    robots: int,
    minutes: float,
    eval_every_s: float,
    eval_episodes: int,
    control_hz: float,
) -> Any:
    """The HG-DAgger run spec of one configuration.

    Raises:
        foundation.runspec.RunSpecError: the spec is invalid.
    """
    from foundation.runspec import parse_run_spec
    from robofleet.commands.demo import sim_fleet_spec

    base = sim_fleet_spec(
        f"bench-operators-{config}",
        "hg-dagger",
        [task],
        robots,
        minutes=minutes,
        eval_every_s=eval_every_s,
        eval_episodes=eval_episodes,
        control_hz=control_hz,
        eval_on="simulator",
    )
    doc = base.model_dump(mode="json", exclude_none=True)
    doc["reward"] = {"source": "labels"}
    if help_doc:
        doc["help"] = dict(help_doc)
    return parse_run_spec(doc)


def run_config(
    config: str,
    help_doc: Mapping[str, Any],
    *,
    task: str = "reach-v3",
    robots: int = 4,
    minutes: float = 3.0,
    eval_every_s: float = 20.0,
    eval_episodes: int = 10,
    control_hz: float = 20.0,
    settings_file: str | None = None,
    keep: Path | None = None,
) -> dict[str, Any]:
    """One run of ``config`` with ``help_doc`` as its ``help:`` in a fresh cloud (a temporary
    ``data_dir``, or ``keep/<config>``).

    Returns:
        ``config``, ``history`` (evals.jsonl rows), ``initial_success`` / ``best_success`` /
        ``final_success`` / ``late_success`` (ground truth, 0..1), ``operator_minutes``,
        ``autonomous_successes``, ``return_on_human_effort`` (per operator minute),
        ``help_requests``, ``interventions``, ``env_steps``, ``minutes``.

    Raises:
        RuntimeError: the run left no result.
    """
    from robofleet.bench.efficiency import run_in_fresh_cloud
    from robofleet.settings import load_settings
    from robofleet.sim.computers import sim_robots

    spec = run_spec(
        config,
        help_doc,
        task=task,
        robots=robots,
        minutes=minutes,
        eval_every_s=eval_every_s,
        eval_episodes=eval_episodes,
        control_hz=control_hz,
    )
    with tempfile.TemporaryDirectory(prefix=f"bench-operators-{config}-") as tmp:
        data_dir = Path(tmp) if keep is None else keep / config
        settings = load_settings(settings_file, data_dir=data_dir)
        edge = settings.edge.model_copy(
            update={"weight_apply_at": "chunk_boundary", "scripted_ready_after_s": 0.0}
        )
        settings = settings.model_copy(update={"edge": edge})
        t0 = time.monotonic()
        run = run_in_fresh_cloud(settings, sim_robots(robots, driver_options=BLIND), spec, "bench")
    if not run.result:
        raise RuntimeError(f"the {config} run left no result")
    r, history = run.result, run.history
    return {
        "config": config,
        "help": dict(help_doc),
        "history": history,
        "initial_success": r.get("initial_success"),
        "final_success": r.get("final_success"),
        "best_success": max((float(h["success_mean"]) for h in history), default=None),
        "late_success": late_success(history),
        "operator_minutes": r.get("operator_minutes"),
        "autonomous_successes": r.get("autonomous_successes"),
        "return_on_human_effort": r.get("return_on_human_effort"),
        "help_requests": r.get("help_requests"),
        "interventions": int(r.get("interventions") or 0),
        "env_steps": int(r.get("env_steps") or 0),
        "minutes": round(float(r.get("minutes") or (time.monotonic() - t0) / 60), 2),
    }
