"""The reward classifier's precision and recall against the simulator's ground truth.

Part of ``robofleet bench rewards``. Episodes come from a blind Meta-World robot (no reward,
no success reported) driven in-process by a mixed policy: the task's scripted expert with
Gaussian noise, interrupted by segments of uniformly random actions (each episode draws its
noise and its share of random segments), so that both successes and failures occur. The
simulator's hidden verdict (``MetaWorldDriver.ground_truth``) plays the person: a success
ends the episode at its first solved step (the verdict step), any other episode is a failure
at its last step. The classifier is fitted on the first k labelled episodes of a fixed pool
and measured on a fixed held-out set:

* per episode: ``cloud_learner.reward_classifier.episode_precision_recall`` on the held-out
  episodes as a person would have labelled them (cut at the verdict);
* per step: :func:`step_precision_recall` of ``P(success) >= threshold`` against the
  simulator's ``success`` on every step of the whole held-out episodes (uncut).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

STATE_KEY = "observation.state"
SEGMENT_STEPS = 10  # length of one expert or random segment of the mixed policy


@dataclass(frozen=True)
class Recorded:
    """One episode of the mixed policy, whole.

    Attributes:
        task: Meta-World task name.
        frames: observation key -> (T, ...) array of the observation after each step.
        success: (T,) bool, the simulator's success after each step (hidden from robofleet).
        first_success: index of the first solved step, None for a failed episode.
    """

    task: str
    frames: dict[str, NDArray[Any]]
    success: NDArray[np.bool_]
    first_success: int | None

    @property
    def steps(self) -> int:
        return int(self.success.shape[0])


def mixed_action(
    expert: Callable[[Any], NDArray[np.float32]],
    obs: Any,
    random_segment: bool,
    noise: float,
    rng: np.random.Generator,
) -> NDArray[np.float32]:
    """The mixed policy's action (float32 (4,) in [-1, 1]): uniform noise in a random
    segment, else the expert's action plus Gaussian noise of std ``noise``."""
    if random_segment:
        return rng.uniform(-1.0, 1.0, 4).astype(np.float32)
    a = np.asarray(expert(obs), np.float32) + rng.normal(0.0, noise, 4).astype(np.float32)
    return np.clip(a, -1.0, 1.0)


def collect(
    task: str,
    seeds: Sequence[int],
    *,
    steps: int,
    cameras: Sequence[str] = (),
    image_size: tuple[int, int] = (32, 32),
    rng_seed: int = 0,
) -> list[Recorded]:
    """One whole episode of ``steps`` actions per seed on a blind Meta-World robot.

    Half the episodes (at random) are careful: expert noise std from U(0, 0.3), no random
    segment; the others draw the noise std from U(0, 1) and their share of random
    :data:`SEGMENT_STEPS`-step segments from U(0, 1). ``rng_seed`` fixes the draws.

    Raises:
        ValueError: an unknown task, or no scripted expert for it.
    """
    from hal.drivers.metaworld import MetaWorldDriver, expert_policy

    expert = expert_policy(task)
    driver = MetaWorldDriver(
        "bench-rewards",
        tasks=[task],
        max_episode_steps=steps,
        cameras=cameras,
        image_size=image_size,
        reward="none",
        detects_success=False,
    )
    rng = np.random.default_rng(rng_seed)
    out: list[Recorded] = []
    driver.connect()
    try:
        for seed in seeds:
            if rng.uniform() < 0.5:  # a careful episode: the expert, a little noise
                noise, random_share = float(rng.uniform(0, 0.3)), 0.0
            else:  # a careless one
                noise, random_share = float(rng.uniform(0, 1)), float(rng.uniform(0, 1))
            obs = driver.reset(task=task, seed=int(seed))
            frames: dict[str, list[NDArray[Any]]] = {k: [] for k in obs}
            truth: list[bool] = []
            random_segment = False
            for t in range(steps):
                if t % SEGMENT_STEPS == 0:
                    random_segment = bool(rng.uniform() < random_share)
                driver.send_action(
                    {"action": mixed_action(expert, obs, random_segment, noise, rng)}
                )
                obs = driver.get_observation()
                for k, v in obs.items():
                    frames[k].append(v)
                gt = driver.ground_truth
                truth.append(bool(gt is not None and gt.success))
            success = np.asarray(truth, dtype=bool)
            first = int(np.argmax(success)) if success.any() else None
            out.append(Recorded(task, {k: np.stack(v) for k, v in frames.items()}, success, first))
    finally:
        driver.disconnect()
    return out


def labelled(rec: Recorded, keys: Sequence[str], task_index: int = 0) -> Any:
    """``rec`` as the person labels it (``cloud_learner.reward_classifier.LabelledEpisode``):
    a success cut at its first solved step (the verdict step), a failure whole with the
    verdict on its last step; only the observation ``keys``."""
    from cloud_learner.reward_classifier import LabelledEpisode

    end = rec.steps if rec.first_success is None else rec.first_success + 1
    return LabelledEpisode(
        frames={k: rec.frames[k][:end] for k in keys},
        verdict="failure" if rec.first_success is None else "success",
        verdict_frame=end - 1,
        task=task_index,
    )


def step_precision_recall(
    probabilities: Sequence[NDArray[Any]], truths: Sequence[NDArray[np.bool_]], threshold: float
) -> tuple[float | None, float | None, int]:
    """Per-step precision and recall of ``P(success) >= threshold`` against the truth.

    Args:
        probabilities: per episode, (T,) P(success) of each step.
        truths: per episode, (T,) bool ground truth of each step.
        threshold: P(success) at or above which a step is predicted a success.

    Returns:
        ``(precision, recall, steps)``: precision None when no step is predicted a success,
        recall None when no step is truly one; ``steps`` counts all steps.

    Raises:
        ValueError: the sequences differ in length, or an episode's shapes differ.
    """
    if len(probabilities) != len(truths):
        raise ValueError(f"{len(probabilities)} probability series for {len(truths)} truths")
    tp = fp = fn = steps = 0
    for p, y in zip(probabilities, truths, strict=True):
        p, y = np.asarray(p), np.asarray(y, dtype=bool)
        if p.shape != y.shape:
            raise ValueError(f"probabilities of shape {p.shape} for truth of shape {y.shape}")
        pred = p >= threshold
        tp += int((pred & y).sum())
        fp += int((pred & ~y).sum())
        fn += int((~pred & y).sum())
        steps += int(y.size)
    precision = None if tp + fp == 0 else tp / (tp + fp)
    recall = None if tp + fn == 0 else tp / (tp + fn)
    return precision, recall, steps


def _round(v: float | None) -> float | None:
    return None if v is None else round(float(v), 3)


def measure(
    pool: Sequence[Recorded],
    heldout: Sequence[Recorded],
    keys: Sequence[str],
    features: dict[str, Any],
    counts: Sequence[int],
    *,
    threshold: float = 0.5,
    epochs: int | None = None,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Fit on the first k episodes of ``pool`` for each k of ``counts`` and measure on
    ``heldout``; one row per k: ``labelled``, ``successes`` (among them),
    ``episode_precision`` / ``episode_recall`` / ``episodes``, ``step_precision`` /
    ``step_recall`` / ``steps``, ``fit_s``; a k whose episodes hold one verdict only is
    reported with ``error`` and null figures.

    Raises:
        ValueError: a count exceeds the pool.
    """
    import time

    from cloud_learner.reward_classifier import episode_precision_recall, fit_reward_classifier

    too_many = [k for k in counts if k > len(pool)]
    if too_many:
        raise ValueError(f"labelled episode counts {too_many} exceed the pool of {len(pool)}")
    test = [labelled(r, keys) for r in heldout]
    rows: list[dict[str, Any]] = []
    for k in counts:
        train = [labelled(r, keys) for r in pool[:k]]
        row: dict[str, Any] = {
            "labelled": k,
            "successes": sum(r.first_success is not None for r in pool[:k]),
        }
        if row["successes"] in (0, k):
            rows.append({**row, "error": "one verdict only", **_no_figures()})
            continue
        t0 = time.monotonic()
        kwargs: dict[str, Any] = (
            {"seed": seed} if epochs is None else {"seed": seed, "epochs": epochs}
        )
        model = fit_reward_classifier(train, features, **kwargs)
        fit_s = time.monotonic() - t0
        ep_p, ep_r, ep_n = episode_precision_recall(model, test, threshold)
        probs = [model.success_probability({key: r.frames[key] for key in keys}) for r in heldout]
        st_p, st_r, st_n = step_precision_recall(probs, [r.success for r in heldout], threshold)
        rows.append(
            {
                **row,
                "episode_precision": _round(ep_p),
                "episode_recall": _round(ep_r),
                "episodes": ep_n,
                "step_precision": _round(st_p),
                "step_recall": _round(st_r),
                "steps": st_n,
                "fit_s": round(fit_s, 1),
            }
        )
    return rows


def _no_figures() -> dict[str, Any]:
    keys = ("episode_precision", "episode_recall", "episodes", "step_precision", "step_recall")
    return {k: None for k in (*keys, "steps", "fit_s")}
