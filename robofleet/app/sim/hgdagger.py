"""HG-DAgger on a simulated Meta-World robot with a simulated operator, end to end.

Start: behaviour cloning on a few expert demonstrations (a weak policy). Then rounds of:
the robot runs the novice (weights as published by the learner), the simulated operator
takes over when the novice strays (:class:`edge_agent.gating.HGDaggerGate`: a max abs action
gap over 0.3 takes over, 5 agreeing steps hand back, the 5th already the novice's), the
labelled steps join the learner's data, and the learner trains and publishes the next
version. Evaluation runs held-out seeded episodes where the operator never acts.

Also trains the baseline: plain BC on expert demonstrations with the same number of operator
labels and the same number of updates.

``python -m robofleet.app.sim.hgdagger`` prints the table used in the closing note.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cloud_learner.algorithms import HGDAgger, HGDAggerConfig
from cloud_learner.config import LearnerSettings
from cloud_learner.evaluation import evaluate_metaworld, make_metaworld_env, scripted_expert
from cloud_learner.loop import Learner
from cloud_learner.policies import MLPPolicy, PolicySpec
from cloud_learner.publisher import InMemoryWeightPublisher
from cloud_learner.sources import InMemorySource
from edge_agent.gating import HGDaggerGate


@dataclass
class SimConfig:
    env_name: str = "reach-v3"
    max_episode_steps: int = 150
    initial_demos: int = 2
    initial_updates: int = 600
    episodes_per_round: int = 10
    updates_per_round: int = 600
    max_rounds: int = 8
    eval_seeds: list[int] = field(default_factory=lambda: list(range(10_000, 10_050)))
    target_success: float = 0.9
    batch_size: int = 128
    hidden: int = 128
    lr: float = 3e-4
    seed: int = 0
    min_state_std: float = 0.05
    hold_steps: int = 10
    # What the reach robot observes: hand xyz + gripper, the same one frame earlier, and the
    # goal. Meta-World's 39-d vector also carries the position of an object that reach never
    # touches; a handful of demonstrations is too few to learn to ignore it.
    state_indices: list[int] = field(
        default_factory=lambda: [0, 1, 2, 3, 18, 19, 20, 21, 36, 37, 38]
    )


Rows = dict[str, list[Any]]


def _empty_rows() -> Rows:
    keys = [
        "observation.state",
        "next.observation.state",
        "action",
        "task_index",
        "is_intervention",
        "is_demonstration",
        "reward",
        "terminated",
        "truncated",
        "episode_index",
        "frame_index",
    ]
    return {k: [] for k in keys}


def run_episode(
    env: Any,
    expert: Any,
    seed: int,
    episode_index: int,
    rows: Rows,
    novice: MLPPolicy | None,
    operator: HGDaggerGate | None,
    max_steps: int,
    hold_steps: int = 0,
    state_indices: Sequence[int] | None = None,
) -> tuple[int, int, bool]:
    """One episode; novice None = pure expert demonstration. Returns (steps, labels, success).

    The episode goes on for ``hold_steps`` after the first success (the robot must stay at the
    goal), so that the data also covers the goal region, not only the approach.
    """
    idx = (
        list(range(env.observation_space.shape[0]))
        if state_indices is None
        else list(state_indices)
    )
    obs, _ = env.reset(seed=seed)
    if operator is not None:
        operator.reset()
    labels = 0
    success = False
    succeeded_at: int | None = None
    for t in range(max_steps):
        expert_action = np.clip(expert.get_action(obs), -1, 1).astype(np.float32)
        if novice is None or operator is None:
            action, inter = expert_action, True
        else:
            proposal = np.clip(
                novice.act({"observation.state": obs[idx].astype(np.float32)}, 0), -1, 1
            )
            inter = operator.decide(proposal, expert_action).expert_in_control
            action = np.asarray(expert_action if inter else proposal, np.float32)
        next_obs, reward, terminated, truncated, info = env.step(action)
        success = info.get("success", 0.0) >= 1.0
        if success and succeeded_at is None:
            succeeded_at = t
        rows["observation.state"].append(obs[idx].astype(np.float32))
        rows["next.observation.state"].append(next_obs[idx].astype(np.float32))
        rows["action"].append(action)
        rows["task_index"].append(0)
        rows["is_intervention"].append(inter)
        rows["is_demonstration"].append(novice is None)
        rows["reward"].append(float(success))
        rows["terminated"].append(bool(terminated))
        rows["truncated"].append(bool(truncated or t == max_steps - 1))
        rows["episode_index"].append(episode_index)
        rows["frame_index"].append(t)
        labels += int(inter)
        obs = next_obs
        if terminated or truncated:
            break
        if succeeded_at is not None and t - succeeded_at >= hold_steps:
            break
    return t + 1, labels, succeeded_at is not None


def _to_columns(rows: Rows) -> dict[str, np.ndarray]:
    out = {k: np.asarray(v) for k, v in rows.items()}
    out["task_index"] = out["task_index"].astype(np.int64)
    return out


def _episode_args(cfg: SimConfig) -> tuple[int, int, list[int]]:
    return cfg.max_episode_steps, cfg.hold_steps, cfg.state_indices


def _settings(cfg: SimConfig) -> LearnerSettings:
    return LearnerSettings.model_validate(
        dict(
            algorithm="hg_dagger",
            device="cpu",
            seed=cfg.seed,
            batch_size=cfg.batch_size,
            min_transitions=1,
            publish_every_updates=10**9,
            publish_every_seconds=1e9,
            checkpoint_every_updates=10**9,
            log_every_updates=50,
            algorithm_config={"lr": cfg.lr},
            policy={
                "state_dim": len(cfg.state_indices),
                "action_dim": 4,
                "hidden": cfg.hidden,
                "depth": 2,
            },
        )
    )


def _make_learner(cfg: SimConfig, run_dir: Path, columns: dict[str, np.ndarray]) -> Learner:
    settings = _settings(cfg)
    torch.manual_seed(cfg.seed)
    spec = PolicySpec(state_dim=len(cfg.state_indices), action_dim=4, hidden=cfg.hidden, depth=2)
    policy = MLPPolicy(spec)
    policy.set_state_normalization(columns["observation.state"], min_std=cfg.min_state_std)
    algo = HGDAgger(policy, HGDAggerConfig(lr=cfg.lr))
    learner = Learner(
        run_dir,
        algo,
        InMemorySource(columns, seed=cfg.seed),
        InMemoryWeightPublisher(),
        settings,
        {"algorithm": "hg_dagger"},
    )
    learner.start(resume=False)
    return learner


def _train(learner: Learner, updates: int) -> None:
    learner.settings = learner.settings.model_copy(update={"max_updates": learner.step + updates})
    learner.run()
    learner._publish()  # a new version for the robot after every round


def _success(policy: MLPPolicy, cfg: SimConfig) -> float:
    results = evaluate_metaworld(
        policy, [cfg.env_name], cfg.eval_seeds, cfg.max_episode_steps, cfg.state_indices
    )
    return results[0].success_rate


def run(cfg: SimConfig, run_dir: Path) -> dict[str, Any]:
    """The whole experiment; returns a JSON-able summary (rounds, env steps, minutes, baseline)."""
    t0 = time.monotonic()
    env = make_metaworld_env(cfg.env_name, cfg.seed, cfg.max_episode_steps)
    expert = scripted_expert(cfg.env_name)
    rows = _empty_rows()
    env_steps = labels = episodes = 0
    for i in range(cfg.initial_demos):
        n, lab, _ = run_episode(
            env, expert, 1000 + i, episodes, rows, None, None, *_episode_args(cfg)
        )
        env_steps, labels, episodes = env_steps + n, labels + lab, episodes + 1
    learner = _make_learner(cfg, run_dir / "hg_dagger", _to_columns(rows))
    _train(learner, cfg.initial_updates)
    robot_policy = MLPPolicy(
        PolicySpec(state_dim=len(cfg.state_indices), action_dim=4, hidden=cfg.hidden, depth=2)
    )
    publisher = learner.publisher
    assert isinstance(publisher, InMemoryWeightPublisher)
    robot_policy.set_weights(publisher.versions[publisher.latest_version()])
    history = [
        {
            "round": 0,
            "env_steps": env_steps,
            "labels": labels,
            "success": _success(robot_policy, cfg),
            "policy_version": learner.version,
        }
    ]
    operator = HGDaggerGate(0.3, 5, "linf", handback_step="novice")
    source = learner.source
    assert isinstance(source, InMemorySource)
    for r in range(1, cfg.max_rounds + 1):
        if history[-1]["success"] >= cfg.target_success:
            break
        new = _empty_rows()
        for _ in range(cfg.episodes_per_round):
            n, lab, _ = run_episode(
                env,
                expert,
                2000 + episodes,
                episodes,
                new,
                robot_policy,
                operator,
                *_episode_args(cfg),
            )
            env_steps, labels, episodes = env_steps + n, labels + lab, episodes + 1
        source.extend(_to_columns(new))
        _train(learner, cfg.updates_per_round)
        robot_policy.set_weights(publisher.versions[publisher.latest_version()])
        history.append(
            {
                "round": r,
                "env_steps": env_steps,
                "labels": labels,
                "success": _success(robot_policy, cfg),
                "policy_version": learner.version,
            }
        )
    minutes = (time.monotonic() - t0) / 60
    total_updates = learner.step
    learner.close()

    # Baseline: expert demonstrations only, same number of labels, same number of updates.
    demo_rows = _empty_rows()
    bc_labels = bc_eps = 0
    while bc_labels < labels:
        _, lab, _ = run_episode(
            env, expert, 5000 + bc_eps, bc_eps, demo_rows, None, None, *_episode_args(cfg)
        )
        bc_labels, bc_eps = bc_labels + lab, bc_eps + 1
    cols = {k: v[:labels] for k, v in _to_columns(demo_rows).items()}
    bc = _make_learner(cfg, run_dir / "bc", cols)
    _train(bc, total_updates)
    bc_policy = bc.algorithm.policy
    assert isinstance(bc_policy, MLPPolicy)
    bc_success = _success(bc_policy, cfg)
    bc.close()
    env.close()
    return {
        "history": history,
        "final_success": history[-1]["success"],
        "env_steps": env_steps,
        "operator_labels": labels,
        "updates": total_updates,
        "minutes": minutes,
        "bc_same_labels_success": bc_success,
        "bc_episodes": bc_eps,
        "config": asdict(cfg),
    }


# -- several tasks: the synchronous baseline of ``robofleet bench efficiency`` ----------------

DEFAULT_TASKS = ["reach-v3", "push-v3", "drawer-close-v3", "button-press-topdown-v3"]


@dataclass
class MultiTaskConfig:
    """The synchronous multi-task HG-DAgger loop, with the distributed run's defaults.

    Policy, gating, data, evaluation and update rate match ``robofleet demo``
    (robofleet.app.orchestration.params.RunParams, edge_agent gating defaults): a shared MLP on
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-rounds", type=int, default=SimConfig.max_rounds)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        result = run(SimConfig(max_rounds=args.max_rounds), Path(d))
    for h in result["history"]:
        print(
            f"round {h['round']}: env steps {h['env_steps']}, labels {h['labels']}, "
            f"success {h['success']:.0%}"
        )
    print(json.dumps({k: v for k, v in result.items() if k != "history"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
