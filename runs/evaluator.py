"""Evaluation episodes: the policy alone (the operator never acts), fixed seeds per task.

The evaluation robot is a simulated robot of the driver kind the run's robots enrolled with
(their robot computer's description), built through ``hal.drivers.make_driver``. An episode
succeeds when the driver reports success within ``max_steps``; an episode an operator rescued
cannot count, because no operator is attached. Seeds ``10_000 + i`` are the fixed evaluation
configurations (a seeded simulator's start states, e.g. Meta-World's goal variation
``seed % 50``); training robot i starts its seeds at 100_000 * (i + 1) + 13 * i (so robots
cover different variations at the same time), demonstrations at 20_000.

The evaluated policy is built exactly as on a robot (``edge_agent.policy_build.CardPolicy``,
from the version's policy card) but acts deterministically: SAC's Gaussian with its mean
``tanh(mu)``, RECAP conditioned on "positive", HG-DAgger's MLP as it is.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hal.driver import RobotDriver

EVAL_SEED = 10_000


def simulator_kind(specs: Mapping[str, Mapping[str, Any]]) -> str:
    """The driver kind the run's robots enrolled with (``spec["computer"]["driver"]``, what a
    robot computer describes itself with): the kind of the simulated evaluation robot.

    Raises:
        ValueError: a robot described no driver kind, or the robots differ (named).
    """
    kinds = {name: (spec.get("computer") or {}).get("driver") for name, spec in specs.items()}
    unknown = sorted(name for name, kind in kinds.items() if not kind)
    if unknown or not kinds:
        raise ValueError(
            f"robots {unknown} described no driver kind (their robot computer, robofleet "
            "edge, describes it); the simulator evaluation builds a robot of that kind"
        )
    if len(set(kinds.values())) > 1:
        raise ValueError(f"the robots run different drivers {dict(sorted(kinds.items()))}")
    return str(next(iter(kinds.values())))


def simulated_robot(kind: str, tasks: Sequence[str], max_steps: int) -> RobotDriver:
    """A simulated robot of driver ``kind`` (not connected) that runs ``tasks``, its episodes
    ending after ``max_steps`` actions.

    Raises:
        ValueError: the kind cannot be built from the run's episode options alone, is not a
            simulator, or does not run every one of ``tasks`` (named).
    """
    from hal.drivers import make_driver

    episode = {"tasks": list(tasks), "max_episode_steps": max_steps}
    driver = make_driver(kind, "eval", episode)
    spec = driver.spec
    if not spec.capabilities.simulated:
        raise ValueError(f"a {kind} robot is not a simulator")
    foreign = [t for t in tasks if spec.tasks and t not in spec.tasks]
    if foreign:
        raise ValueError(f"a simulated {kind} robot runs {spec.tasks}, not {foreign}")
    return driver


def build_policy(dims: tuple[int, int], num_tasks: int, hidden: int) -> Any:
    """The edge agents' policy (``edge_agent.build``) in evaluation mode: built from each
    version's policy card, an MLP on state + task one-hot ``hidden`` wide without one.
    ``dims``: the run's (state, action) sizes."""
    from edge_agent.policy_build import CardPolicy

    return CardPolicy(dims[0], dims[1], num_tasks, hidden, stochastic=False)


def evaluate(
    policy: Any, kind: str, tasks: Sequence[str], episodes: int, max_steps: int
) -> dict[str, float]:
    """Success rate (0..1) per task over ``episodes`` seeded episodes each, on a simulated
    robot of driver ``kind`` (:func:`simulated_robot`, ``cloud_learner.evaluation.evaluate``).
    """
    from cloud_learner.evaluation import evaluate as evaluate_on

    driver = simulated_robot(kind, tasks, max_steps)
    driver.connect()
    try:
        seeds = [EVAL_SEED + i for i in range(episodes)]
        return evaluate_on(policy, driver, tasks, seeds, max_steps)
    finally:
        driver.disconnect()


class Evaluator:
    """Plain class behind the evaluation Ray actor (one per run, its own process).

    Args:
        kind: driver kind of the simulated evaluation robot (:func:`simulator_kind`).
        tasks / dims / hidden: the run's tasks, (state, action) sizes, policy width.
        episodes / max_steps: evaluation episodes per task and their step limit.
        nice: added to the process's niceness.
    """

    def __init__(
        self,
        kind: str,
        tasks: Sequence[str],
        dims: tuple[int, int],
        hidden: int,
        episodes: int,
        max_steps: int,
        nice: int = 0,
    ) -> None:
        import torch

        torch.set_num_threads(1)
        if nice:
            os.nice(nice)  # the measuring instrument yields the CPU to what it measures
        self.kind = kind
        self.tasks = list(tasks)
        self.policy = build_policy(dims, len(self.tasks), hidden)
        self.episodes = episodes
        self.max_steps = max_steps

    def evaluate(self, weights: bytes) -> dict[str, float]:
        """``weights``: a safetensors file's bytes (what the learner published)."""
        from safetensors.torch import load

        self.policy.set_weights(load(weights))
        return evaluate(self.policy, self.kind, self.tasks, self.episodes, self.max_steps)


def remote_evaluator(**actor_options: Any) -> Any:
    import ray

    return ray.remote(**{"num_cpus": 0, **actor_options})(Evaluator)
