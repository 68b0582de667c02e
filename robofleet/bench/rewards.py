"""``robofleet bench rewards``: learning on blind robots, from labels and a reward classifier.

Two parts, on Meta-World robots that report no reward and no success (as an arm does):

1. Precision/recall of the reward classifier (``cloud_learner.reward_classifier``) against the
   simulator's ground truth, as a function of labelled episodes (5, 10, 20, 40), on reach-v3
   and push-v3, from the 39-d state alone and from the state plus a 32x32 ``corner`` camera
   (:mod:`robofleet.bench.reward_pr`: episodes of a mixed expert/random policy collected
   in-process; the simulator's verdict plays the person; a fixed held-out set; per episode
   and per step).
2. SAC/RLPD runs of the full system side by side in the same wall-clock budget, one per
   ``reward.source`` (``robot``: the simulator's true sparse reward; ``labels``: the simulated
   person's verdict on every episode; ``classifier``: the person labels the first episodes,
   the classifier gives the reward after; ``none``: the control, nobody labels and no reward
   reaches the learner), with ground-truth success over time from the cloud's simulator
   evaluation (:mod:`robofleet.bench.reward_runs`).

Prints a table per part, writes the success curves to ``--figure`` (PNG), and prints one JSON
object as the last stdout line: precision/recall per task, observation and label count,
initial/final/best/late ground-truth success per source (late: the mean of the last third of
the evaluation points), ``classifier_vs_robot_late`` = late success with the classifier /
late success with the true sparse reward, and ``classifier_minus_none_late`` = late success
with the classifier minus the control's (what the classifier's reward added).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from foundation.clitext import plain_text
from robofleet.bench.reward_runs import SAC_KNOBS, SOURCES
from robofleet.bench.success_figure import save_success_figure

FIGURE = Path("docs/figures/bench_rewards.png")
CAMERA = "corner"
IMAGE_SIZE = (32, 32)
EPISODE_STEPS = 100
THRESHOLD = 0.5


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def _words(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def precision_recall(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Part 1: one row per task x observation x label count (:func:`reward_pr.measure`)."""
    from robofleet.bench.reward_pr import STATE_KEY, collect, measure

    pool_size = max(args.labels)
    rows: list[dict[str, Any]] = []
    for task in args.pr_tasks:
        cameras = [CAMERA] if "camera" in args.observations else []
        t0 = time.monotonic()
        # One collection serves both observations: the state variant reads its key only.
        pool = collect(task, range(pool_size), steps=EPISODE_STEPS, cameras=cameras, rng_seed=1)
        heldout = collect(
            task,
            range(50_000, 50_000 + args.heldout),
            steps=EPISODE_STEPS,
            cameras=cameras,
            rng_seed=2,
        )
        collect_s = time.monotonic() - t0
        features = _features(task, cameras)
        for obs in args.observations:
            keys = [STATE_KEY] + ([f"observation.images.{CAMERA}"] if obs == "camera" else [])
            chosen = {k: features[k] for k in keys}
            for row in measure(
                pool, heldout, keys, chosen, args.labels, threshold=THRESHOLD, epochs=args.epochs
            ):
                rows.append({"task": task, "observation": obs, **row})
        logging.getLogger(__name__).info("collected %s in %.0f s", task, collect_s)
        rows_heldout = sum(r.first_success is not None for r in heldout)
        for r in rows:
            if r["task"] == task:
                r["heldout_successes"] = f"{rows_heldout}/{len(heldout)}"
    return rows


def _features(task: str, cameras: Sequence[str]) -> dict[str, Any]:
    """The blind robot's observation features (LeRobot feature dicts), before ``connect``."""
    from hal.drivers.metaworld import MetaWorldDriver

    return MetaWorldDriver(
        "bench-rewards", tasks=[task], cameras=cameras, image_size=IMAGE_SIZE
    ).observation_features


def runs(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Part 2: one SAC run per source, in the same budget (:func:`reward_runs.run_source`)."""
    from robofleet.bench.reward_runs import run_source

    knobs = {**SAC_KNOBS, **(args.knob or {})}
    return [
        run_source(
            source,
            task="reach-v3",
            robots=args.robots,
            minutes=args.minutes,
            eval_every_s=args.eval_every,
            eval_episodes=args.eval_episodes,
            demonstrations=args.demonstrations,
            labelled_episodes=args.labelled_episodes,
            control_hz=args.control_hz,
            knobs=knobs,
            config=args.config,
            keep=args.keep,
        )
        for source in args.sources
    ]


def summary(pr: list[dict[str, Any]], sourced: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON object: ``precision_recall`` (task -> observation -> label count -> figures),
    ``runs`` (source -> initial/final/best ground-truth success, env steps, episodes) and
    ``classifier_vs_robot_late`` (None when either run is missing or the robot's is 0) and
    ``classifier_minus_none_late`` (None when either run is missing)."""
    nested: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
    for r in pr:
        figures = {
            k: r.get(k)
            for k in ("episode_precision", "episode_recall", "step_precision", "step_recall")
        }
        nested.setdefault(r["task"], {}).setdefault(r["observation"], {})[str(r["labelled"])] = (
            figures
        )
    keys = ("initial_success", "final_success", "best_success", "late_success", "env_steps",
            "episodes", "endings", "classifier")  # fmt: skip
    by_source = {r["source"]: {k: r.get(k) for k in keys} for r in sourced}

    def late(source: str) -> float | None:
        v = by_source.get(source, {}).get("late_success")
        return None if v is None else float(v)

    clf, true, none = late("classifier"), late("robot"), late("none")
    return {
        "bench": "rewards",
        "precision_recall": nested,
        "runs": by_source,
        "classifier_vs_robot_late": None if clf is None or not true else round(clf / true, 3),
        "classifier_minus_none_late": None if clf is None or none is None else round(clf - none, 3),
    }


def plot(sourced: list[dict[str, Any]], path: Path, title: str) -> None:
    """Ground-truth success (0..1) against wall time (s), one line per source."""
    names = {"robot": "true sparse reward", "labels": "labels", "classifier": "classifier",
             "none": "control: no reward"}  # fmt: skip
    curves = [(f"reward.source: {r['source']} ({names.get(r['source'], '')})", r["history"])
              for r in sourced]  # fmt: skip
    save_success_figure(curves, path, title)


def _print_tables(pr: list[dict[str, Any]], sourced: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    def fmt(v: Any) -> str:
        return "-" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v))

    console = Console(width=None if sys.stdout.isatty() else 150)
    cols: tuple[str, ...]
    if pr:
        t = Table(title=f"reward classifier vs ground truth (threshold {THRESHOLD})")
        cols = ("task", "observation", "labelled", "successes", "episode_precision",
                "episode_recall", "step_precision", "step_recall", "heldout_successes", "fit_s")  # fmt: skip
        for c in cols:
            t.add_column(c.replace("_", " "), justify="right")
        for r in pr:
            t.add_row(*(fmt(r.get(c)) for c in cols))
        console.print(t)
    if sourced:
        t = Table(title="SAC/RLPD on blind reach-v3 robots, same budget: ground-truth success")
        cols = ("source", "initial_success", "best_success", "final_success", "late_success",
                "env_steps", "episodes", "minutes")  # fmt: skip
        for c in cols:
            t.add_column(c.replace("_", " "), justify="right")
        for r in sourced:
            t.add_row(*(fmt(r.get(c)) for c in cols))
        console.print(t)
        t = Table(title="how the episodes ended (episode marks), and the last classifier")
        for c in ("source", "endings", "classifier (held out)"):
            t.add_column(c)
        for r in sourced:
            ends = ", ".join(f"{k}: {v}" for k, v in sorted((r.get("endings") or {}).items()))
            k = r.get("classifier") or {}
            clf = (f"v{k['version']:g}: {k['train_episodes']:g} trained on, "
                   f"{k['holdout_episodes']:g} held out, precision {k['precision']:.2f}, "
                   f"recall {k['recall']:.2f}") if k else "-"  # fmt: skip
            t.add_row(r["source"], ends or "-", clf)
        console.print(t)


def _knob(s: str) -> tuple[str, float]:
    key, _, value = s.partition("=")
    if not key or not value:
        raise argparse.ArgumentTypeError(f"--knob {s!r}: expected NAME=NUMBER")
    return key, float(value)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="robofleet bench rewards",
        description=plain_text(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", default=None, help="YAML settings file")
    p.add_argument("--quick", action="store_true", help="small sizes: a few minutes")
    p.add_argument("--json", action="store_true", help="(the JSON line is always printed last)")
    p.add_argument("--parts", type=_words, default=["pr", "runs"],
                   help="pr (precision/recall), runs (SAC per source), or both (default)")  # fmt: skip
    p.add_argument("--pr-tasks", type=_words, default=None, help="default reach-v3,push-v3")
    p.add_argument("--observations", type=_words, default=["state", "camera"],
                   help="state and/or camera (state + 32x32 corner camera)")  # fmt: skip
    p.add_argument("--labels", type=_ints, default=None, help="default 5,10,20,40")
    p.add_argument("--heldout", type=int, default=None, help="held-out episodes per task")
    p.add_argument("--epochs", type=int, default=None, help="classifier epochs (its default)")
    p.add_argument("--sources", type=_words, default=list(SOURCES), help="reward sources")
    p.add_argument("--minutes", type=float, default=None, help="budget of each run")
    p.add_argument("--robots", type=int, default=2, help="robots of each run")
    p.add_argument("--control-hz", type=float, default=40.0, help="robots' control rate")
    p.add_argument("--demonstrations", type=int, default=10, help="expert demonstrations")
    p.add_argument("--labelled-episodes", type=int, default=10,
                   help="classifier: episodes each robot's person labels")  # fmt: skip
    p.add_argument("--eval-every", type=float, default=None, metavar="SECONDS",
                   help="evaluation cadence (default 20; --quick 15)")  # fmt: skip
    p.add_argument("--eval-episodes", type=int, default=10, help="evaluation episodes")
    p.add_argument("--knob", type=_knob, action="append", default=None, metavar="NAME=NUMBER",
                   help=f"a SAC hyper-parameter (defaults: {SAC_KNOBS})")  # fmt: skip
    p.add_argument("--figure", type=Path, default=FIGURE, help="PNG of the success curves")
    p.add_argument("--keep", type=Path, default=None, metavar="DIR",
                   help="keep each run's data directory under DIR/<source> (default: removed)")  # fmt: skip
    return p


def _defaults(args: argparse.Namespace) -> None:
    quick = args.quick
    args.pr_tasks = args.pr_tasks or (["reach-v3"] if quick else ["reach-v3", "push-v3"])
    args.labels = args.labels or ([5, 10, 20] if quick else [5, 10, 20, 40])
    args.heldout = args.heldout or (10 if quick else 20)
    args.minutes = args.minutes or (1.5 if quick else 3.0)
    args.eval_every = args.eval_every or (15.0 if quick else 20.0)
    args.knob = dict(args.knob) if args.knob else None


def main(argv: Sequence[str] = ()) -> int:
    parser = build_parser()
    args = parser.parse_args(list(argv))
    _defaults(args)
    bad = [x for x in args.parts if x not in ("pr", "runs")]
    bad += [x for x in args.sources if x not in SOURCES]
    bad += [x for x in args.observations if x not in ("state", "camera")]
    if bad:
        parser.error(f"unknown part, source or observation {bad}")
    if min(args.labels) < 2:
        parser.error(f"--labels needs at least 2 episodes each, got {args.labels}")
    import torch

    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING)
    pr = precision_recall(args) if "pr" in args.parts else []
    sourced = runs(args) if "runs" in args.parts else []
    if sourced:
        plot(
            sourced,
            args.figure,
            f"SAC/RLPD, {args.robots} blind reach-v3 robots, {args.minutes:g} min each",
        )
    _print_tables(pr, sourced)
    out = summary(pr, sourced)
    out["quick"] = args.quick
    out["figure"] = str(args.figure) if sourced else None
    print(json.dumps(out, default=str), flush=True)
    return 0
