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
    (robofleet.runspec.RunParams, edge_agent gating defaults): a shared MLP on
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


def _mt_evaluate(policy: MLPPolicy, cfg: MultiTaskConfig) -> dict[str, float]:
    # The very evaluation the distributed run uses (fixed seeds, no operator).
    from robofleet.app.orchestration.evaluator import evaluate

    return evaluate(policy, cfg.tasks, cfg.eval_episodes, cfg.max_episode_steps)


def _expert_episode(
    driver: Any, expert: Any, task: str, task_index: int, seed: int, steps: int, out: LabelledSteps
) -> int:
    obs = driver.reset(task=task, seed=seed)
    for _ in range(steps):
        action = np.clip(expert(obs), -1, 1)
        out.add(obs["observation.state"], action, task_index)
        driver.send_action({"action": action})
        obs = driver.get_observation()
    return steps


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
    from hal.drivers.metaworld import MetaWorldDriver, expert_policy

    t0 = time.monotonic()
    driver = MetaWorldDriver("sync", tasks=list(cfg.tasks), max_episode_steps=cfg.max_episode_steps)
    driver.connect()
    experts = {t: expert_policy(t) for t in cfg.tasks}
    data = LabelledSteps(cfg.seed)
    for i, task in enumerate(cfg.tasks):
        for k in range(cfg.demos_per_task):
            _expert_episode(
                driver,
                experts[task],
                task,
                i,
                20_000 + i * cfg.demos_per_task + k,
                cfg.max_episode_steps,
                data,
            )
    demo_labels = len(data)
    algo = _mt_algorithm(cfg, data)
    _mt_train(algo, data, cfg.bc_updates, cfg.batch_size)
    policy = algo.policy
    assert isinstance(policy, MLPPolicy)
    from edge_agent.gating import HGDaggerGate

    gate = HGDaggerGate(cfg.gap, cfg.handback_steps, "l2")
    env_steps = labels = 0
    updates = cfg.bc_updates
    history: list[dict[str, Any]] = []

    def evaluate_now() -> float:
        success = _mt_evaluate(policy, cfg)
        mean = float(np.mean(list(success.values())))
        history.append(
            dict(
                env_steps=env_steps,
                labels=labels,
                updates=updates,
                success_mean=mean,
                success=success,
                wall_s=time.monotonic() - t0,
            )
        )
        return mean

    best = evaluate_now()
    next_eval = cfg.eval_every_steps
    episode = finetunes = 0
    try:
        while best < cfg.target_success and env_steps < cfg.max_env_steps:
            task_index = episode % len(cfg.tasks)
            task = cfg.tasks[task_index]
            obs = driver.reset(task=task, seed=100_000 + episode)
            gate.reset()
            intervened = 0
            for _ in range(cfg.max_episode_steps):
                novice = np.clip(policy.act(obs, task_index), -1, 1)
                expert = np.clip(experts[task](obs), -1, 1)
                if gate.decide(novice, expert).expert_in_control:
                    data.add(obs["observation.state"], expert, task_index)
                    action, intervened = expert, intervened + 1
                else:
                    action = novice
                driver.send_action({"action": action})
                obs = driver.get_observation()
            env_steps += cfg.max_episode_steps
            labels += intervened
            episode += 1
            if intervened:  # fine-tune after each intervened episode
                n = round(cfg.updates_per_step * cfg.max_episode_steps)
                _mt_train(algo, data, n, cfg.batch_size)
                updates += n
                finetunes += 1
            if env_steps >= next_eval:
                next_eval += cfg.eval_every_steps
                best = max(best, evaluate_now())
    finally:
        driver.disconnect()
    hit = next((h for h in history if h["success_mean"] >= cfg.target_success), None)
    return {
        "history": history,
        "initial_success": history[0]["success_mean"],
        "best_success": max(h["success_mean"] for h in history),
        "env_steps_to_target": None if hit is None else hit["env_steps"],
        "labels_to_target": None if hit is None else hit["labels"],
        "demo_labels": demo_labels,
        "env_steps": env_steps,
        "labels": labels,
        "updates": updates,
        "episodes": episode,
        "finetunes": finetunes,
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
    from hal.drivers.metaworld import MetaWorldDriver, expert_policy

    driver = MetaWorldDriver("bc", tasks=list(cfg.tasks), max_episode_steps=cfg.max_episode_steps)
    driver.connect()
    experts = {t: expert_policy(t) for t in cfg.tasks}
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
            policy = algo.policy
            assert isinstance(policy, MLPPolicy)
            success = _mt_evaluate(policy, cfg)
            mean = float(np.mean(list(success.values())))
            history.append(dict(labels=len(data), updates=n, success_mean=mean, success=success))
            if mean >= cfg.target_success:
                break
    finally:
        driver.disconnect()
    hit = next((h for h in history if h["success_mean"] >= cfg.target_success), None)
    return {
        "history": history,
        "labels_to_target": None if hit is None else hit["labels"],
        "best_success": max((h["success_mean"] for h in history), default=0.0),
    }
