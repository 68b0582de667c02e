"""Labelled episodes of a blind Meta-World reach robot (reward and success hidden), for the
reward classifier's tests: the scripted expert acts, with action noise on every other episode
so that some episodes fail; the simulator's ground truth plays the person's verdict (success
at the first solved step, which ends the episode; failure at the last step)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from cloud_learner.reward_classifier import LabelledEpisode
from hal.drivers.metaworld import MetaWorldDriver, expert_policy


@dataclass
class ReachEpisodes:
    """``episodes`` with the observation each step reached, ``starts`` the observation each
    began from, and the robot's ``features``."""

    episodes: list[LabelledEpisode]
    starts: list[dict[str, np.ndarray]]
    actions: list[np.ndarray]
    features: dict[str, Any]


def reach_episodes(n: int, steps: int = 60, seed: int = 0, noise: float = 1.5) -> ReachEpisodes:
    d = MetaWorldDriver(
        "blind-0",
        tasks=["reach-v3"],
        max_episode_steps=steps,
        reward="none",
        detects_success=False,
    )
    d.connect()
    act = expert_policy("reach-v3")
    rng = np.random.default_rng(seed)
    out = ReachEpisodes([], [], [], dict(d.observation_features))
    try:
        for i in range(n):
            obs = d.reset(task="reach-v3", seed=seed * 1000 + i)
            out.starts.append({k: np.asarray(v) for k, v in obs.items()})
            scale = 0.0 if i % 2 == 0 else noise
            frames: dict[str, list[np.ndarray]] = {k: [] for k in d.observation_features}
            actions, verdict = [], "failure"
            for _ in range(steps):
                a = act(obs) + scale * rng.standard_normal(4)
                a = np.clip(a, -1, 1).astype(np.float32)
                d.send_action({"action": a})
                obs = d.get_observation()
                actions.append(a)
                for k in frames:
                    frames[k].append(np.asarray(obs[k]))
                gt = d.ground_truth
                if gt is not None and gt.success:
                    verdict = "success"
                    break
            stacked = {k: np.stack(v) for k, v in frames.items()}
            last = len(actions) - 1
            out.episodes.append(LabelledEpisode(stacked, verdict, last))
            out.actions.append(np.stack(actions))
    finally:
        d.disconnect()
    return out


def buffer_records(
    data: ReachEpisodes, robot_id: str = "robot-1", run_id: str = "run-1"
) -> list[dict[str, Any]]:
    """The episodes as a robot's buffer step records (each ends at its verdict: a success
    terminated, a failure truncated, with its final observation)."""
    records: list[dict[str, Any]] = []
    for e, (ep, start, actions) in enumerate(
        zip(data.episodes, data.starts, data.actions, strict=True)
    ):
        state = ep.frames["observation.state"]
        for t in range(len(state)):
            last = t == len(state) - 1
            row: dict[str, Any] = {
                "seq": len(records),
                "robot_id": robot_id,
                "run_id": run_id,
                "task": "reach-v3",
                "episode_index": e,
                "frame_index": t,
                "timestamp": t / 20,
                "reward": 0.0,
                "terminated": last and ep.verdict == "success",
                "truncated": last and ep.verdict == "failure",
                "is_intervention": False,
                "policy_version": 1,
                "action": actions[t],
                "observation.state": start["observation.state"] if t == 0 else state[t - 1],
            }
            if last:
                row["next.observation.state"] = state[t]
            records.append(row)
    return records
