"""``robofleet bench efficiency``: is the distributed system as sample-efficient as the plain loop?

Side by side in one process run, on the same tasks (default: the demo's four), the same policy
(shared MLP on the 39-d state + task one-hot), the same gating (L2 action gap > 0.3 hands
control to the scripted expert, 5 agreeing steps hand it back) and the same update rate
(0.5 updates per env step):

(a) ``sync``: the synchronous single-process HG-DAgger loop
    (:func:`cloud_learner.hgdagger_sim.run_multitask`, fine-tunes after each intervened
    episode);
(b) ``system``: the full system (:class:`robofleet.orchestration.service.CloudService`, the
    run the demo launches) with a stop condition on the target success or a time cap;
(c) ``bc``: behaviour cloning on expert demonstrations, growing the labels until the target.

Reports env steps to reach the target for (a) and (b) and labels for (b) and (c):
``steps_ratio_vs_sync`` = system / sync (target <= 1.5), ``labels_ratio_vs_bc`` = system / bc
(target <= 0.5). Whatever does not reach the target within its cap is reported as null with
the best success it reached. ``--scaling`` instead times the system to the target with 1, 2,
4, 8 robots (``--robots-list``) and writes a PNG plot; efficiency = speed-up / robots.

The last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cloud_learner.hgdagger_sim import (
    DEFAULT_TASKS,
    MultiTaskConfig,
    run_bc_growth,
    run_multitask,
)

TARGET = 0.9


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
) -> dict[str, Any]:
    """One run of the full system (what ``robofleet demo`` launches) until ``target`` average
    success of the policy alone or ``minutes``; a fresh cloud (local Ray, SQLite, buffers)
    in ``data_dir`` (a temporary directory when None), no dashboard.

    Returns ``history`` (the run's evals.jsonl rows: wall_s, env_steps, interventions,
    success_mean...), ``env_steps_to_target`` / ``labels_to_target`` / ``wall_s_to_target``
    (None if not reached), ``best_success``, totals and the achieved env steps/s per robot.

    Raises:
        RuntimeError: the cloud did not start or the run produced no result.
    """
    from robofleet.orchestration.service import CloudService
    from robofleet.runspec import parse_run_spec
    from robofleet.settings import load_settings

    with tempfile.TemporaryDirectory(prefix="bench-eff-") as tmp:
        root = data_dir or Path(tmp)
        settings = load_settings(config, data_dir=root)
        spec = parse_run_spec(
            {
                "version": 1,
                "name": f"bench-efficiency-{robots}",
                "algorithm": "hg-dagger",
                "tasks": list(tasks),
                "hyperparameters": {"control_hz": 20.0},
                "policy": {"kind": "mlp", "hidden_sizes": [128, 128]},
                "robots": {
                    "robot_type": "metaworld-sawyer",
                    "tags": {"simulated": "true"},
                    "count": robots,
                },
                "learner": {"num_cpus": 1.0},
                "publish": {"every_updates": 50, "every_seconds": 5.0},
                "evaluation": {"every_seconds": eval_every_s, "episodes_per_task": eval_episodes},
                "stop": {"minutes": minutes, "target_success": target},
            }
        )
        cloud = CloudService(
            settings, sim_robots=robots, dashboard_port=None, grpc_port=0, auto_resume=False
        )
        t0 = time.monotonic()
        try:
            cloud.start()
            assert cloud.manager is not None
            run_id = cloud.manager.launch(spec, actor="bench-efficiency")
            driver = cloud.manager.drivers[run_id]
            while driver.alive:
                time.sleep(0.5)
            result = dict(driver.result)
            progress = dict(driver.progress)
            evals_path = driver.run_dir / "evals.jsonl"
            history = (
                [json.loads(line) for line in evals_path.read_text().splitlines() if line]
                if evals_path.exists()
                else []
            )
        finally:
            cloud.close()
    if not result:
        raise RuntimeError(f"the system run with {robots} robots produced no result")
    hit = next((h for h in history if h["success_mean"] >= target), None)
    env_steps = int(result.get("env_steps") or 0)
    run_minutes = float(result.get("minutes") or (time.monotonic() - t0) / 60)
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
        "learner_updates_per_s": progress.get("learner_updates_per_s"),
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
        target=args.target,
        eval_episodes=args.eval_episodes,
        config=args.config,
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
        "_raw": {"sync": sync, "system": system, "bc": bc},
    }


def scaling(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    """Wall time to the target with each robot count; efficiency = (T1 / TN) / N."""
    rows = []
    for n in args.robots_list:
        r = run_system(
            args.tasks,
            n,
            args.system_minutes or (3.0 if args.quick else 10.0),
            target=args.target,
            eval_episodes=args.eval_episodes,
            config=args.config,
        )
        rows.append(r)
        out_dir.mkdir(parents=True, exist_ok=True)
        with open(out_dir / "scaling_runs.jsonl", "a") as f:  # kept if a later count fails
            f.write(json.dumps(r, default=str) + "\n")
    rows.sort(key=lambda r: int(r["robots"]))
    base = next((r for r in rows if r["robots"] == 1), None)
    t1 = base["wall_s_to_target"] if base else None
    table = []
    for r in rows:
        tn = r["wall_s_to_target"]
        speedup = _ratio(t1, tn)
        table.append(
            {
                "robots": r["robots"],
                "wall_s_to_target": tn,
                "best_success": r["best_success"],
                "minutes_run": round(r["minutes"], 2),
                "env_steps": r["env_steps"],
                "env_steps_per_s_per_robot": r["env_steps_per_s_per_robot"],
                "speedup": speedup,
                "efficiency": None if speedup is None else round(speedup / r["robots"], 3),
            }
        )
    plot = out_dir / "scaling.png"
    _plot_scaling(rows, plot, args.target)
    return {"bench": "efficiency-scaling", "tasks": list(args.tasks), "rows": table,
            "target_success": args.target,
            "plot": str(plot)}  # fmt: skip


def _plot_scaling(rows: list[dict[str, Any]], path: Path, target: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for r in rows:
        h = r["history"]
        ax1.plot([e["wall_s"] for e in h], [e["success_mean"] for e in h], marker="o",
                 label=f"{r['robots']} robots")  # fmt: skip
    ax1.axhline(target, color="grey", ls="--")
    ax1.set_xlabel("wall time (s)")
    ax1.set_ylabel("average success (policy alone)")
    ax1.legend()
    xs = [r["robots"] for r in rows if r["wall_s_to_target"] is not None]
    ax2.plot(xs, [r["wall_s_to_target"] for r in rows if r["wall_s_to_target"] is not None],
             marker="o")  # fmt: skip
    ax2.set_xlabel("robots")
    ax2.set_ylabel(f"wall s to success {target} (unreached: not drawn)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _print_tables(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    def fmt(v: Any) -> str:
        return "not reached" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))

    console = Console()
    if summary["bench"] == "efficiency-scaling":
        t = Table(title=f"fleet scaling: wall time to success {summary['target_success']}")
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="robofleet bench efficiency", description=__doc__)
    p.add_argument("--config", default=None, help="YAML settings file")
    p.add_argument("--json", action="store_true", help="(the JSON line is always printed last)")
    p.add_argument("--quick", action="store_true", help="small caps: a few minutes")
    p.add_argument("--scaling", action="store_true", help="time 1/2/4/8 robots to the target")
    p.add_argument("--robots-list", type=lambda s: [int(x) for x in s.split(",")],
                   default=[1, 2, 4, 8], help="robot counts for --scaling")  # fmt: skip
    p.add_argument("--tasks", type=lambda s: [t for t in s.split(",") if t],
                   default=list(DEFAULT_TASKS))  # fmt: skip
    p.add_argument("--target", type=float, default=TARGET, help="target average success")
    p.add_argument("--robots", type=int, default=4, help="robots of the system run")
    p.add_argument("--system-minutes", type=float, default=None, help="cap of a system run")
    p.add_argument("--sync-max-steps", type=int, default=None, help="cap of the sync loop")
    p.add_argument("--bc-labels", type=lambda s: [int(x) for x in s.split(",")], default=None)
    p.add_argument("--eval-episodes", type=int, default=10, help="evaluation episodes per task")
    p.add_argument("--out", type=Path, default=Path("bench-results"), help="plots go here")
    return p


def main(argv: Sequence[str] = ()) -> int:
    args = build_parser().parse_args(list(argv))
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
