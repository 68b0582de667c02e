"""``robofleet bench efficiency``: is the distributed system as sample-efficient as the plain loop?

Side by side in one process run, on the same tasks (default: the demo's four), the same policy
(shared MLP on the 39-d state + task one-hot), the same gating (L2 action gap > 0.3 hands
control to the scripted expert, 5 agreeing steps hand it back) and the same update rate
(0.5 updates per env step):

(a) ``sync``: the synchronous single-process HG-DAgger loop
    (:func:`robofleet.sim.hgdagger.run_multitask`, fine-tunes after each intervened
    episode);
(b) ``system``: the full system (:class:`robofleet.cloud.CloudService`, the
    run the demo launches) with a stop condition on the target success or a time cap;
(c) ``bc``: behaviour cloning on expert demonstrations, growing the labels until the target.

The system's weight cadence is the bench's own (``--publish-every-updates``,
``--publish-every-seconds``, ``--weight-apply-at``; defaults below). A third table puts the
two schedules side by side: updates per env step, env steps per policy version, labels per
episode, intervention rate, and the staleness the robots measured at act time (versions
received but not yet applied, how long a version waited for its boundary); the synchronous
loop acts with the newest policy by construction (lag 0).

Reports env steps to reach the target for (a) and (b) and labels for (b) and (c):
``steps_ratio_vs_sync`` = system / sync (target <= 1.5), ``labels_ratio_vs_bc`` = system / bc
(target <= 0.5). Whatever does not reach the target within its cap is reported as null with
the best success it reached. ``--scaling`` instead times the system to the target with 1, 2,
4, 8 robots (``--robots-list``), ``--repeats`` interleaved runs of each, and reports each
count's median time and a PNG plot; efficiency = speed-up / robots.

The last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from foundation.clitext import plain_text
from robofleet.commands.demo import (
    PUBLISH_EVERY_SECONDS,
    PUBLISH_EVERY_UPDATES,
    SAMPLES_PER_INSERT,
    UPDATES_PER_S,
    sim_fleet_spec,
)
from robofleet.sim.hgdagger import (
    DEFAULT_TASKS,
    MultiTaskConfig,
    first_at_target,
    run_bc_growth,
    run_multitask,
)

if TYPE_CHECKING:
    from robofleet.cloud import CloudService
    from runs.run import RunDriver

TARGET = 0.9
# Robots apply a new version at each action-chunk boundary (the measurement behind the
# cadence is at robofleet.commands.demo.PUBLISH_EVERY_UPDATES); None: the edge
# settings' own.
WEIGHT_APPLY_AT: str | None = "chunk_boundary"


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else round(a / b, 3)


def run_system(
    tasks: Sequence[str],
    robots: int,
    minutes: float,
    *,
    target: float = TARGET,
    eval_every_s: float = 10.0,
    eval_episodes: int = 10,
    config: str | None = None,
    data_dir: Path | None = None,
    publish_every_updates: int = PUBLISH_EVERY_UPDATES,
    publish_every_seconds: float = PUBLISH_EVERY_SECONDS,
    weight_apply_at: str | None = WEIGHT_APPLY_AT,
    updates_per_s: float | None = UPDATES_PER_S,
    samples_per_insert: float | None = SAMPLES_PER_INSERT,
) -> dict[str, Any]:
    """One run of the full system (what ``robofleet demo`` launches) until ``target`` average
    success of the policy alone or ``minutes``; a fresh cloud (local Ray, SQLite, buffers)
    in ``data_dir`` (a temporary directory when None), no dashboard. The learner publishes
    every ``publish_every_updates`` updates or ``publish_every_seconds``; robots apply a new
    version at ``weight_apply_at`` (``edge.weight_apply_at``; None keeps the settings').
    ``updates_per_s`` caps the learner (None: the run's default, RunParams.updates_per_s);
    ``samples_per_insert`` ties its updates to the robots' data (``buffer.samples_per_insert``;
    None: only the cap).

    Returns ``history`` (the run's evals.jsonl rows: wall_s, env_steps, interventions,
    success_mean...), ``env_steps_to_target`` / ``labels_to_target`` / ``wall_s_to_target``
    (None if not reached), ``best_success``, totals, the achieved env steps/s per robot and
    ``schedule`` (:func:`_system_schedule`: staleness and update-to-data figures).

    Raises:
        RuntimeError: the cloud did not start or the run produced no result.
    """
    from robofleet.settings import load_settings
    from robofleet.sim.computers import sim_robots

    with tempfile.TemporaryDirectory(prefix="bench-eff-") as tmp:
        settings = load_settings(config, data_dir=data_dir or Path(tmp))
        if weight_apply_at is not None:
            edge = settings.edge.model_copy(update={"weight_apply_at": weight_apply_at})
            settings = settings.model_copy(update={"edge": edge})
        spec = sim_fleet_spec(
            f"bench-efficiency-{robots}",
            "hg-dagger",
            tasks,
            robots,
            minutes=minutes,
            eval_every_s=eval_every_s,
            eval_episodes=eval_episodes,
            updates_per_s=updates_per_s,
            samples_per_insert=samples_per_insert,
            publish_every_updates=publish_every_updates,
            publish_every_seconds=publish_every_seconds,
            target_success=target,
        )
        t0 = time.monotonic()
        run = run_in_fresh_cloud(settings, sim_robots(robots), spec, "bench-efficiency")
    if not run.result:
        raise RuntimeError(f"the system run with {robots} robots produced no result")
    return _system_summary(
        run,
        robots,
        target,
        elapsed_min=(time.monotonic() - t0) / 60,
        publish={"every_updates": publish_every_updates, "every_seconds": publish_every_seconds},
        weight_apply_at=weight_apply_at or settings.edge.weight_apply_at,
    )


@dataclass
class _SystemRun:
    """What a finished system run left: the driver's ``result`` and ``progress``, its
    ``history`` (evals.jsonl rows) and ``robot_stats`` (robot name -> its last stats)."""

    result: dict[str, Any]
    progress: dict[str, Any]
    history: list[dict[str, Any]]
    robot_stats: dict[str, dict[str, Any]]


def run_in_fresh_cloud(settings: Any, robots: Any, spec: Any, actor: str) -> _SystemRun:
    """Launch ``spec`` in a fresh local cloud (no dashboard, any free port, no resume) with
    ``robots`` (``robofleet.sim.computers.sim_robots``), follow it to its end, close the
    cloud; the run as :func:`_follow` saw it."""
    from robofleet.cloud import CloudService

    cloud = CloudService(
        settings, robots=robots, dashboard_port=None, grpc_port=0, auto_resume=False
    )
    try:
        cloud.start()
        assert cloud.manager is not None
        run_id = cloud.manager.launch(spec, actor=actor)
        return _follow(cloud, cloud.manager.drivers[run_id])
    finally:
        cloud.close()


def _follow(cloud: CloudService, driver: RunDriver) -> _SystemRun:
    """Wait for the run to end, reading the robots' heartbeat stats every 2 s while it runs."""
    robot_stats: dict[str, dict[str, Any]] = {}
    last_poll = 0.0
    while driver.alive:
        time.sleep(0.5)
        if time.monotonic() - last_poll >= 2.0:  # agents' heartbeats, while they run
            last_poll = time.monotonic()
            robot_stats.update(_robot_stats(cloud.store))
    result = dict(driver.result)
    progress = dict(driver.progress)
    evals_path = driver.run_dir / "evals.jsonl"
    history = (
        [json.loads(line) for line in evals_path.read_text().splitlines() if line]
        if evals_path.exists()
        else []
    )
    robot_stats.update(_robot_stats(cloud.store))
    # The agents' own final reports are complete; the last heartbeat seen may not be.
    robot_stats.update(driver.robot_reports)
    return _SystemRun(result, progress, history, robot_stats)


def _system_summary(
    run: _SystemRun,
    robots: int,
    target: float,
    *,
    elapsed_min: float,
    publish: dict[str, Any],
    weight_apply_at: str,
) -> dict[str, Any]:
    """:func:`run_system`'s return value; ``elapsed_min`` stands in for the run's minutes
    when its result has none."""
    result, history = run.result, run.history
    hit = first_at_target(history, target)
    env_steps = int(result.get("env_steps") or 0)
    run_minutes = float(result.get("minutes") or elapsed_min)
    return {
        "robots": robots,
        "history": history,
        "initial_success": result.get("initial_success"),
        "final_success": result.get("final_success"),
        "best_success": max((h["success_mean"] for h in history), default=0.0),
        "env_steps_to_target": None if hit is None else hit["env_steps"],
        "labels_to_target": None if hit is None else hit["interventions"],
        "wall_s_to_target": None if hit is None else round(hit["wall_s"], 1),
        "env_steps": env_steps,
        "labels": result.get("interventions"),
        "versions_published": result.get("versions_published"),
        "acked_lost": result.get("acked_lost"),
        "minutes": run_minutes,
        "env_steps_per_s_per_robot": round(env_steps / max(run_minutes * 60, 1e-9) / robots, 2),
        # Up to the target only: after it the run waits for that evaluation and stops.
        "env_steps_per_s_per_robot_to_target": None
        if hit is None or hit["wall_s"] <= 0
        else round(hit["env_steps"] / hit["wall_s"] / robots, 2),
        "learner_updates_per_s": run.progress.get("learner_updates_per_s"),
        "publish": publish,
        "weight_apply_at": weight_apply_at,
        "schedule": _system_schedule(
            list(run.robot_stats.values()), run.progress, env_steps, result
        ),
    }


def _robot_stats(store: Any) -> dict[str, dict[str, Any]]:
    """Robot name -> its edge agent's last heartbeat report; robots whose last heartbeat
    came from the idle simulated host (no agent running: no ``steps``) are left out."""
    from sqlalchemy import select

    from foundation.store.models import Robot

    with store.session() as s:
        return {
            r.name: dict(r.stats) for r in s.scalars(select(Robot)) if (r.stats or {}).get("steps")
        }


def _system_schedule(
    robots: list[dict[str, Any]], progress: dict[str, Any], env_steps: int, result: dict[str, Any]
) -> dict[str, Any]:
    """The run's schedule, comparable with :func:`_sync_schedule`.

    ``updates_per_env_step``: learner updates after the BC warm start per robot step;
    ``env_steps_per_version``: robot steps per published version; ``labels_per_episode`` and
    ``intervention_rate`` from the robots' own counters; ``version_lag_mean``: versions the
    robot had received but not applied when it acted (0 = acted on the newest it had);
    ``stale_step_fraction``: share of such steps; ``apply_delay_mean_s``: how long a received
    version waited for its safe boundary.
    """
    from foundation.runspec import RunParams

    steps = sum(float(r.get("steps", 0)) for r in robots)
    swaps = sum(float(r.get("weight_swaps", 0)) for r in robots)
    episodes = sum(float(r.get("episodes", 0)) for r in robots)
    labels = sum(float(r.get("interventions", 0)) for r in robots)
    versions = int(result.get("versions_published") or progress.get("policy_version") or 0)
    updates = max(0, int(progress.get("learner_step") or 0) - RunParams().bc_updates)

    def weighted(key: str, by: str, total: float) -> float | None:
        if not total:
            return None
        return round(sum(float(r.get(key, 0)) * float(r.get(by, 0)) for r in robots) / total, 3)

    return {
        "updates_per_env_step": round(updates / env_steps, 3) if env_steps else None,
        "env_steps_per_version": round(env_steps / (versions - 1), 1) if versions > 1 else None,
        "labels_per_episode": round(labels / episodes, 1) if episodes else None,
        "intervention_rate": round(labels / steps, 3) if steps else None,
        "version_lag_mean": weighted("version_lag_mean", "steps", steps),
        "stale_step_fraction": round(sum(float(r.get("stale_steps", 0)) for r in robots) / steps, 3)
        if steps
        else None,
        "apply_delay_mean_s": weighted("apply_delay_mean_s", "weight_swaps", swaps),
        "robot_steps": int(steps),
    }


def _sync_schedule(sync: dict[str, Any], bc_updates: int) -> dict[str, Any]:
    """The synchronous loop's schedule in :func:`_system_schedule`'s terms: it acts only with
    the newest policy (lag 0) and makes one version per intervened episode."""
    steps, episodes = sync["env_steps"], sync["episodes"]
    return {
        "updates_per_env_step": round((sync["updates"] - bc_updates) / steps, 3) if steps else None,
        "env_steps_per_version": round(steps / sync["finetunes"], 1) if sync["finetunes"] else None,
        "labels_per_episode": round(sync["labels"] / episodes, 1) if episodes else None,
        "intervention_rate": round(sync["labels"] / steps, 3) if steps else None,
        "version_lag_mean": 0.0,
        "stale_step_fraction": 0.0,
        "apply_delay_mean_s": 0.0,
        "robot_steps": steps,
    }


def efficiency(args: argparse.Namespace) -> dict[str, Any]:
    """The (a)/(b)/(c) comparison; returns the JSON summary (also holds the raw results)."""
    tasks = args.tasks
    quick = args.quick
    cfg = MultiTaskConfig(
        tasks=list(tasks),
        max_env_steps=args.sync_max_steps or (4_000 if quick else 20_000),
        eval_episodes=args.eval_episodes,
        target_success=args.target,
    )
    sync = run_multitask(cfg)
    system = run_system(
        tasks,
        args.robots,
        args.system_minutes or (2.5 if quick else 8.0),
        **_system_options(args),
    )
    budgets = args.bc_labels or ([400, 1600, 3200] if quick else [800, 1600, 3200, 6400, 12800])
    bc = run_bc_growth(cfg, budgets)
    return {
        "bench": "efficiency",
        "tasks": list(tasks),
        "target_success": args.target,
        "quick": quick,
        "sync_env_steps_to_target": sync["env_steps_to_target"],
        "sync_labels_to_target": sync["labels_to_target"],
        "sync_best_success": sync["best_success"],
        "sync_initial_success": sync["initial_success"],
        "system_env_steps_to_target": system["env_steps_to_target"],
        "system_labels_to_target": system["labels_to_target"],
        "system_wall_s_to_target": system["wall_s_to_target"],
        "system_best_success": system["best_success"],
        "system_initial_success": system["initial_success"],
        "system_robots": args.robots,
        "system_env_steps_per_s_per_robot": system["env_steps_per_s_per_robot"],
        "system_acked_lost": system["acked_lost"],
        "bc_labels_to_target": bc["labels_to_target"],
        "bc_best_success": bc["best_success"],
        "bc_max_labels_tried": max((h["labels"] for h in bc["history"]), default=0),
        "steps_ratio_vs_sync": _ratio(system["env_steps_to_target"], sync["env_steps_to_target"]),
        "labels_ratio_vs_bc": _ratio(system["labels_to_target"], bc["labels_to_target"]),
        # For reference: the synchronous loop against BC (the premise).
        "sync_labels_ratio_vs_bc": _ratio(sync["labels_to_target"], bc["labels_to_target"]),
        "system_publish_every_updates": system["publish"]["every_updates"],
        "system_weight_apply_at": system["weight_apply_at"],
        "sync_schedule": _sync_schedule(sync, cfg.bc_updates),
        "system_schedule": system["schedule"],
        "_raw": {"sync": sync, "system": system, "bc": bc},
    }


def _system_options(args: argparse.Namespace) -> dict[str, Any]:
    """:func:`run_system`'s keyword arguments from the command line (a rate of 0: None)."""
    return {
        "target": args.target,
        "eval_episodes": args.eval_episodes,
        "config": args.config,
        "publish_every_updates": args.publish_every_updates,
        "publish_every_seconds": args.publish_every_seconds,
        "weight_apply_at": args.weight_apply_at,
        "updates_per_s": args.updates_per_s or None,
        "samples_per_insert": args.samples_per_insert or None,
        "eval_every_s": args.eval_every,
    }


def scaling(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    """Wall time to the target with each robot count, ``args.repeats`` runs of each.

    Runs are interleaved (1, 2, 4, 8, 1, 2, ...), so drift in the machine's load hits every
    count alike. A count's time is the median of its runs (a run that never reached the
    target counts as infinitely slow: a median among those is reported as not reached);
    speed-up = median T1 / median TN, efficiency = speed-up / N (the issue's definition).
    Every run is appended to ``out_dir/scaling_runs.jsonl`` as it ends; the plot goes to
    ``out_dir/scaling.png``.
    """
    runs: list[dict[str, Any]] = []
    for rep in range(args.repeats):
        for n in args.robots_list:
            r = run_system(
                args.tasks,
                n,
                args.system_minutes or (3.0 if args.quick else 10.0),
                **_system_options(args),
            )
            r["repeat"] = rep
            runs.append(r)
            out_dir.mkdir(parents=True, exist_ok=True)
            with open(out_dir / "scaling_runs.jsonl", "a") as f:  # kept if a later run fails
                f.write(json.dumps(r, default=str) + "\n")
    by_count = {n: [r for r in runs if r["robots"] == n] for n in sorted(set(args.robots_list))}
    medians = {
        n: _median_or_none([r["wall_s_to_target"] for r in rs]) for n, rs in by_count.items()
    }
    t1 = medians.get(1)
    table = []
    for n, mine in by_count.items():
        speedup = _ratio(t1, medians[n])
        table.append(
            {
                "robots": n,
                "runs": len(mine),
                "wall_s_to_target": medians[n],
                "wall_s_each": " / ".join(
                    "-" if r["wall_s_to_target"] is None else f"{r['wall_s_to_target']:.1f}"
                    for r in mine
                ),
                "env_steps_to_target": _median_or_none([r["env_steps_to_target"] for r in mine]),
                "env_steps_per_s_per_robot_to_target": _median_or_none(
                    [r.get("env_steps_per_s_per_robot_to_target") for r in mine]
                ),
                "speedup": speedup,
                "efficiency": None if speedup is None else round(speedup / n, 3),
            }
        )
    plot = out_dir / "scaling.png"
    _plot_scaling(runs, medians, plot, args.target)
    return {
        "bench": "efficiency-scaling",
        "tasks": list(args.tasks),
        "target_success": args.target,
        "repeats": args.repeats,
        "rows": table,
        "efficiency_at_max_robots": table[-1]["efficiency"] if table else None,
        "plot": str(plot),
    }


def _median_or_none(values: Sequence[float | None]) -> float | None:
    """Median where None is +inf (never reached); None when the median is unreached."""
    if not values:
        return None
    m = statistics.median(math.inf if v is None else float(v) for v in values)
    return None if math.isinf(m) else round(m, 1)


def _plot_scaling(
    runs: list[dict[str, Any]], medians: dict[int, float | None], path: Path, target: float
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    counts = sorted(medians)
    for r in runs:
        h = r["history"]
        c = colors[counts.index(r["robots"]) % len(colors)]
        label = f"{r['robots']} robots" if r.get("repeat", 0) == 0 else None
        ax1.plot([e["wall_s"] for e in h], [e["success_mean"] for e in h], marker=".", color=c,
                 alpha=0.8, label=label)  # fmt: skip
    ax1.axhline(target, color="grey", ls="--")
    ax1.set_xlabel("wall time (s)")
    ax1.set_ylabel("average success (policy alone)")
    ax1.legend()
    each = [(r["robots"], r["wall_s_to_target"]) for r in runs if r["wall_s_to_target"] is not None]
    ax2.scatter([n for n, _ in each], [t for _, t in each], color="grey", s=12, label="each run")
    reached = [(n, t) for n, t in medians.items() if t is not None]
    ax2.plot([n for n, _ in reached], [t for _, t in reached], marker="o", label="median")
    ax2.set_xlabel("robots")
    ax2.set_ylabel(f"wall s to success {target} (unreached: not drawn)")
    ax2.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _print_tables(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    def fmt(v: Any) -> str:
        return "not reached" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))

    console = Console(width=None if sys.stdout.isatty() else 150)  # a log file keeps columns
    if summary["bench"] == "efficiency-scaling":
        t = Table(
            title=f"fleet scaling: wall time to success {summary['target_success']} "
            f"(median of {summary['repeats']} run(s) per count)"
        )
        for col in summary["rows"][0]:
            t.add_column(col, justify="right")
        for r in summary["rows"]:
            t.add_row(*(fmt(v) for v in r.values()))
        console.print(t)
        console.print(f"plot: {summary['plot']}")
        return
    t = Table(
        title=f"efficiency to success {summary['target_success']} on {', '.join(summary['tasks'])}"
    )
    for col in ("method", "initial", "best", "env steps to 0.9", "labels to 0.9"):
        t.add_column(col, justify="right")
    s = summary
    t.add_row("sync HG-DAgger", fmt(s["sync_initial_success"]), fmt(s["sync_best_success"]),
              fmt(s["sync_env_steps_to_target"]), fmt(s["sync_labels_to_target"]))  # fmt: skip
    t.add_row(f"system ({s['system_robots']} robots)", fmt(s["system_initial_success"]),
              fmt(s["system_best_success"]), fmt(s["system_env_steps_to_target"]),
              fmt(s["system_labels_to_target"]))  # fmt: skip
    t.add_row("BC on expert demos", "-", fmt(s["bc_best_success"]), "-",
              fmt(s["bc_labels_to_target"]))  # fmt: skip
    console.print(t)
    r = Table(title="ratios")
    r.add_column("ratio")
    r.add_column("value", justify="right")
    r.add_column("target", justify="right")
    r.add_row("steps_ratio_vs_sync", fmt(s["steps_ratio_vs_sync"]), "<= 1.5")
    r.add_row("labels_ratio_vs_bc", fmt(s["labels_ratio_vs_bc"]), "<= 0.5")
    console.print(r)
    sched = Table(
        title=(
            f"schedule (system: publish every {s['system_publish_every_updates']} updates, "
            f"apply at {s['system_weight_apply_at']})"
        )
    )
    sched.add_column("figure")
    sched.add_column("sync", justify="right")
    sched.add_column("system", justify="right")
    for key in s["sync_schedule"]:
        sched.add_row(key, fmt(s["sync_schedule"][key]), fmt(s["system_schedule"].get(key)))
    console.print(sched)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="robofleet bench efficiency", description=plain_text(__doc__))
    p.add_argument("--config", default=None, help="YAML settings file")
    p.add_argument("--json", action="store_true", help="(the JSON line is always printed last)")
    p.add_argument("--quick", action="store_true", help="small caps: a few minutes")
    p.add_argument("--scaling", action="store_true", help="time 1/2/4/8 robots to the target")
    p.add_argument("--robots-list", type=lambda s: [int(x) for x in s.split(",")],
                   default=[1, 2, 4, 8], help="robot counts for --scaling")  # fmt: skip
    p.add_argument("--tasks", type=lambda s: [t for t in s.split(",") if t],
                   default=list(DEFAULT_TASKS), help="comma-separated Meta-World tasks")  # fmt: skip
    p.add_argument("--target", type=float, default=TARGET, help="target average success")
    p.add_argument("--repeats", type=int, default=1,
                   help="--scaling: runs per robot count (interleaved); medians are reported")  # fmt: skip
    p.add_argument("--robots", type=int, default=4, help="robots of the system run")
    p.add_argument("--system-minutes", type=float, default=None, help="cap of a system run")
    p.add_argument("--sync-max-steps", type=int, default=None, help="cap of the sync loop")
    p.add_argument("--bc-labels", type=lambda s: [int(x) for x in s.split(",")], default=None,
                   help="comma-separated label budgets of the BC baseline")  # fmt: skip
    p.add_argument("--eval-episodes", type=int, default=10, help="evaluation episodes per task")
    p.add_argument("--eval-every", type=float, default=10.0, metavar="SECONDS",
                   help="system: policy snapshot cadence, the wall-time resolution")  # fmt: skip
    p.add_argument("--out", type=Path, default=Path("bench-results"), help="plots go here")
    p.add_argument("--publish-every-updates", type=int, default=PUBLISH_EVERY_UPDATES,
                   help="system: learner publishes a version every N updates")  # fmt: skip
    p.add_argument("--publish-every-seconds", type=float, default=PUBLISH_EVERY_SECONDS,
                   help="system: ... or every T seconds")  # fmt: skip
    p.add_argument("--weight-apply-at", default=WEIGHT_APPLY_AT,
                   choices=["episode_end", "chunk_boundary", "every_n_steps"],
                   help="system: robots' weight boundary (default: edge settings')")  # fmt: skip
    p.add_argument("--updates-per-s", type=float, default=UPDATES_PER_S,
                   help="system: learner's update-rate cap (0: the run's default)")  # fmt: skip
    p.add_argument("--samples-per-insert", type=float, default=SAMPLES_PER_INSERT,
                   help="system: sampled rows per robot row inserted (0: no rule)")  # fmt: skip
    return p


def main(argv: Sequence[str] = ()) -> int:
    parser = build_parser()
    args = parser.parse_args(list(argv))
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    import torch

    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING)
    summary = scaling(args, args.out) if args.scaling else efficiency(args)
    _print_tables(summary)
    raw = summary.pop("_raw", None)
    if raw is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "efficiency_raw.json").write_text(json.dumps(raw, indent=1, default=str))
    print(json.dumps(summary, default=str), flush=True)
    return 0
