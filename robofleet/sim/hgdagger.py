"""HG-DAgger in one process on simulated Meta-World robots: the synchronous baseline of
``robofleet bench efficiency``, and plain behaviour cloning on growing expert data.

:func:`run_multitask`: behaviour cloning on a few expert demonstrations (a weak policy), then
episodes where the novice acts and the scripted expert, behind the edge agent's own HG-DAgger
gate (:class:`edge_agent.gating.HGDaggerGate`), takes over when it strays; the labelled steps
train the policy. :func:`run_bc_growth`: BC on expert demonstrations only. Both evaluate with
the run's own evaluation (``cloud_learner.evaluation`` on hal's Meta-World driver: held-out
seeded episodes where the operator never acts).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from cloud_learner.algorithms import HGDAgger, HGDAggerConfig
from cloud_learner.policies import MLPPolicy, PolicySpec

DEFAULT_TASKS = ["reach-v3", "push-v3", "drawer-close-v3", "button-press-topdown-v3"]


@dataclass
class MultiTaskConfig:
    """The synchronous multi-task HG-DAgger loop, with the distributed run's defaults.

    Policy, gating, data, evaluation and update rate match ``robofleet demo``
    (foundation.runspec.RunParams, edge_agent gating defaults): a shared MLP on
    the 39-d Meta-World state plus a task one-hot, one scripted demonstration per task and
    ``bc_updates`` BC updates as the weak start, the L2 action gap > ``gap`` hands control to
    the expert, ``handback_steps`` agreeing steps hand it back, and only labelled steps are
    trained on. ``updates_per_step`` is the learner's updates per env step (the demo's learner
    runs at most 40 updates/s against 4 robots x 20 Hz = 80 steps/s: 0.5).
    """

    tasks: list[str] = field(default_factory=lambda: list(DEFAULT_TASKS))
    max_episode_steps: int = 100
    demos_per_task: int = 1
    bc_updates: int = 300
    updates_per_step: float = 0.5
    batch_size: int = 128
    hidden: int = 128
    lr: float = 1e-3
    min_state_std: float = 0.05
    gap: float = 0.3
    handback_steps: int = 5
    eval_episodes: int = 10
    eval_every_steps: int = 800
    target_success: float = 0.9
    max_env_steps: int = 20_000
    seed: int = 0


class LabelledSteps:
    """Growing in-memory store of labelled steps (observation.state (N, 39) float32, action
    (N, 4) float32, task_index (N,) int64); samples uniform batches of labelled rows."""

    def __init__(self, seed: int) -> None:
        self.state: list[np.ndarray] = []
        self.action: list[np.ndarray] = []
        self.task: list[int] = []
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return len(self.task)

    def add(self, state: np.ndarray, action: np.ndarray, task_index: int) -> None:
        self.state.append(np.asarray(state, np.float32))
        self.action.append(np.asarray(action, np.float32))
        self.task.append(task_index)

    def sample(self, batch_size: int) -> dict[str, torch.Tensor]:
        """One batch (the layout of cloud_learner.batch). Raises ValueError when empty."""
        if not self.task:
            raise ValueError("nothing to sample: no labelled step yet")
        idx = self.rng.integers(0, len(self.task), batch_size)
        return {
            "observation.state": torch.from_numpy(np.stack([self.state[i] for i in idx])),
            "action": torch.from_numpy(np.stack([self.action[i] for i in idx])),
            "task_index": torch.from_numpy(np.asarray([self.task[i] for i in idx], np.int64)),
            "is_intervention": torch.ones(batch_size, dtype=torch.bool),
        }


def _mt_algorithm(cfg: MultiTaskConfig, data: LabelledSteps) -> HGDAgger:
    torch.manual_seed(cfg.seed)
    policy = MLPPolicy(PolicySpec(39, 4, num_tasks=len(cfg.tasks), hidden=cfg.hidden, depth=2))
    policy.set_state_normalization(np.stack(data.state), min_std=cfg.min_state_std)
    return HGDAgger(policy, HGDAggerConfig(lr=cfg.lr))


def _mt_train(algo: HGDAgger, data: LabelledSteps, updates: int, batch_size: int) -> None:
    for _ in range(updates):
        algo.update(data.sample(batch_size))


def _mt_policy(algo: HGDAgger) -> MLPPolicy:
    policy = algo.policy
    assert isinstance(policy, MLPPolicy)
    return policy


def _mt_evaluate(policy: MLPPolicy, cfg: MultiTaskConfig) -> tuple[dict[str, float], float]:
    """Success rate per task and its mean over tasks, the policy acting alone."""
    # The very evaluation the distributed run uses (fixed seeds, no operator).
    from runs.evaluator import evaluate

    success = evaluate(policy, "metaworld", cfg.tasks, cfg.eval_episodes, cfg.max_episode_steps)
    return success, float(np.mean(list(success.values())))


def first_at_target(history: Sequence[dict[str, Any]], target: float) -> dict[str, Any] | None:
    """The first evaluation row whose ``success_mean`` reached ``target``; None if none did."""
    return next((h for h in history if h["success_mean"] >= target), None)


def _sim_robot(name: str, cfg: MultiTaskConfig) -> tuple[Any, dict[str, Any]]:
    """A connected Meta-World driver on ``cfg.tasks`` and each task's scripted expert."""
    from hal.drivers.metaworld import MetaWorldDriver, expert_policy

    driver = MetaWorldDriver(name, tasks=list(cfg.tasks), max_episode_steps=cfg.max_episode_steps)
    driver.connect()
    return driver, {t: expert_policy(t) for t in cfg.tasks}


def _expert_episode(
    driver: Any, expert: Any, task: str, task_index: int, seed: int, steps: int, out: LabelledSteps
) -> None:
    obs = driver.reset(task=task, seed=seed)
    for _ in range(steps):
        action = np.clip(expert(obs), -1, 1)
        out.add(obs["observation.state"], action, task_index)
        driver.send_action({"action": action})
        obs = driver.get_observation()


def _demonstrations(
    driver: Any, experts: dict[str, Any], cfg: MultiTaskConfig, out: LabelledSteps
) -> None:
    """``cfg.demos_per_task`` scripted episodes per task (seeds 20_000 + i * demos_per_task
    + k for task i's k-th demonstration), every step a label."""
    for i, task in enumerate(cfg.tasks):
        for k in range(cfg.demos_per_task):
            _expert_episode(
                driver,
                experts[task],
                task,
                i,
                20_000 + i * cfg.demos_per_task + k,
                cfg.max_episode_steps,
                out,
            )


class _SyncLoop:
    """The synchronous HG-DAgger loop's parts and counters: the robot, the experts, the
    gate, the labelled steps, the algorithm and its evaluations so far (``history``)."""

    def __init__(
        self,
        cfg: MultiTaskConfig,
        driver: Any,
        experts: dict[str, Any],
        data: LabelledSteps,
        algo: HGDAgger,
        t0: float,
    ) -> None:
        from edge_agent.gating import HGDaggerGate

        self.cfg, self.driver, self.experts, self.data, self.algo = cfg, driver, experts, data, algo
        self.policy = _mt_policy(algo)
        self.gate = HGDaggerGate(cfg.gap, cfg.handback_steps, "l2")
        self.t0 = t0
        self.env_steps = self.labels = self.episodes = self.finetunes = 0
        self.updates = cfg.bc_updates
        self.history: list[dict[str, Any]] = []

    def evaluate(self) -> float:
        """Evaluate the policy alone, append the row to ``history``; returns its mean success."""
        success, mean = _mt_evaluate(self.policy, self.cfg)
        self.history.append(
            dict(
                env_steps=self.env_steps,
                labels=self.labels,
                updates=self.updates,
                success_mean=mean,
                success=success,
                wall_s=time.monotonic() - self.t0,
            )
        )
        return mean

    def run(self, best: float) -> None:
        """Episodes until ``best`` success reaches the target or the env-step cap; fine-tunes
        after each intervened episode, evaluates every ``eval_every_steps`` env steps."""
        cfg = self.cfg
        next_eval = cfg.eval_every_steps
        while best < cfg.target_success and self.env_steps < cfg.max_env_steps:
            intervened = self.episode()
            self.env_steps += cfg.max_episode_steps
            self.labels += intervened
            self.episodes += 1
            if intervened:  # fine-tune after each intervened episode
                n = round(cfg.updates_per_step * cfg.max_episode_steps)
                _mt_train(self.algo, self.data, n, cfg.batch_size)
                self.updates += n
                self.finetunes += 1
            if self.env_steps >= next_eval:
                next_eval += cfg.eval_every_steps
                best = max(best, self.evaluate())

    def episode(self) -> int:
        """One gated episode (task ``episodes % len(tasks)``, seed 100_000 + episodes): the
        novice acts, the expert takes over when the gate says so and its actions are labelled.
        Returns the labelled (intervened) steps."""
        cfg = self.cfg
        task_index = self.episodes % len(cfg.tasks)
        task = cfg.tasks[task_index]
        obs = self.driver.reset(task=task, seed=100_000 + self.episodes)
        self.gate.reset()
        intervened = 0
        for _ in range(cfg.max_episode_steps):
            novice = np.clip(self.policy.act(obs, task_index), -1, 1)
            expert = np.clip(self.experts[task](obs), -1, 1)
            if self.gate.decide(novice, expert).expert_in_control:
                self.data.add(obs["observation.state"], expert, task_index)
                action, intervened = expert, intervened + 1
            else:
                action = novice
            self.driver.send_action({"action": action})
            obs = self.driver.get_observation()
        return intervened


def run_multitask(cfg: MultiTaskConfig) -> dict[str, Any]:
    """Synchronous single-process HG-DAgger on ``cfg.tasks`` until ``target_success`` or
    ``max_env_steps``. Episodes cycle through the tasks (seeds 100_000 + episode); after
    each episode with an intervention the policy gets round(updates_per_step * steps) updates;
    every ``eval_every_steps`` env steps it is evaluated alone.

    Returns a JSON-able dict: ``history`` (env_steps, labels, updates, success_mean, success,
    wall_s per evaluation), ``env_steps_to_target`` / ``labels_to_target`` (None if not
    reached), ``best_success``, ``demo_labels``, ``env_steps``, ``labels``, ``updates``,
    ``episodes`` and ``finetunes`` (policy versions after the BC start).
    Labels count operator interventions, not the initial demonstrations.
    """
    t0 = time.monotonic()
    driver, experts = _sim_robot("sync", cfg)
    data = LabelledSteps(cfg.seed)
    _demonstrations(driver, experts, cfg, data)
    demo_labels = len(data)
    algo = _mt_algorithm(cfg, data)
    _mt_train(algo, data, cfg.bc_updates, cfg.batch_size)
    loop = _SyncLoop(cfg, driver, experts, data, algo, t0)
    best = loop.evaluate()
    try:
        loop.run(best)
    finally:
        driver.disconnect()
    history = loop.history
    hit = first_at_target(history, cfg.target_success)
    return {
        "history": history,
        "initial_success": history[0]["success_mean"],
        "best_success": max(h["success_mean"] for h in history),
        "env_steps_to_target": None if hit is None else hit["env_steps"],
        "labels_to_target": None if hit is None else hit["labels"],
        "demo_labels": demo_labels,
        "env_steps": loop.env_steps,
        "labels": loop.labels,
        "updates": loop.updates,
        "episodes": loop.episodes,
        "finetunes": loop.finetunes,
        "minutes": (time.monotonic() - t0) / 60,
    }


def run_bc_growth(
    cfg: MultiTaskConfig, label_budgets: Sequence[int], min_updates: int = 2000
) -> dict[str, Any]:
    """Behaviour cloning on scripted-expert demonstrations only, growing the number of expert
    labels through ``label_budgets`` (ascending; whole 100-step episodes cycling the tasks,
    seeds 20_000 + episode) until ``target_success``. Each budget trains a fresh policy from
    scratch with max(min_updates, updates_per_step * labels) updates (at least the sync
    loop's schedule). Returns ``history`` (labels, updates, success_mean, success),
    ``labels_to_target`` (None if no budget reached it) and ``best_success``.
    """
    driver, experts = _sim_robot("bc", cfg)
    data = LabelledSteps(cfg.seed)
    history: list[dict[str, Any]] = []
    episode = 0
    try:
        for budget in sorted(label_budgets):
            while len(data) < budget:
                i = episode % len(cfg.tasks)
                _expert_episode(
                    driver,
                    experts[cfg.tasks[i]],
                    cfg.tasks[i],
                    i,
                    20_000 + episode,
                    cfg.max_episode_steps,
                    data,
                )
                episode += 1
            algo = _mt_algorithm(cfg, data)
            n = max(min_updates, round(cfg.updates_per_step * len(data)))
            _mt_train(algo, data, n, cfg.batch_size)
            success, mean = _mt_evaluate(_mt_policy(algo), cfg)
            history.append(dict(labels=len(data), updates=n, success_mean=mean, success=success))
            if mean >= cfg.target_success:
                break
    finally:
        driver.disconnect()
    hit = first_at_target(history, cfg.target_success)
    return {
        "history": history,
        "labels_to_target": None if hit is None else hit["labels"],
        "best_success": max((h["success_mean"] for h in history), default=0.0),
    }
